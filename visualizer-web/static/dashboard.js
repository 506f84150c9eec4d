// Copy buttons and the selected point's highlight. No framework; htmx (live app only) swaps cards.
document.addEventListener("click", (event) => {
  const button = event.target.closest("button.copy");
  if (!button) return;
  const from = button.dataset.copyFrom;
  const text = from ? document.getElementById(from).textContent : button.dataset.copy;
  const done = () => { button.textContent = "copied"; setTimeout(() => { button.textContent = "copy"; }, 1200); };
  if (navigator.clipboard && window.isSecureContext) {
    navigator.clipboard.writeText(text).then(done, () => { button.textContent = "select + Ctrl-C"; });
  } else {
    const area = document.createElement("textarea");
    area.value = text;
    document.body.appendChild(area);
    area.select();
    try { document.execCommand("copy"); done(); } finally { area.remove(); }
  }
});

document.addEventListener("htmx:afterSwap", (event) => {
  const card = event.detail.target.querySelector(".card[data-point]");
  if (!card) return;
  document.querySelectorAll(".pt.selected").forEach((el) => el.classList.remove("selected"));
  const pt = document.getElementById("pt-" + card.dataset.point);
  if (pt) pt.classList.add("selected");
});
