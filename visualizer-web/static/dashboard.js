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

// The block diagram is laid out 1470 px wide: shrink it to fit a wrap up to 25% narrower (a
// 1400 px window shows final_norm and lm_head without scrolling); narrower screens scroll it.
function fitDiagrams() {
  document.querySelectorAll(".diagramwrap").forEach((wrap) => {
    const diagram = wrap.querySelector(".diagram");
    if (!diagram) return;
    diagram.style.zoom = "";
    const scale = wrap.clientWidth / diagram.offsetWidth;
    if (scale < 1 && scale >= 0.75) diagram.style.zoom = String(Math.floor(scale * 1000) / 1000);
  });
}
document.addEventListener("DOMContentLoaded", fitDiagrams);
window.addEventListener("resize", fitDiagrams);
document.addEventListener("htmx:afterSettle", fitDiagrams);
