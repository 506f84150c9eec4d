"""Sparse dictionaries: `SAE` (tensors + `DictMeta` + the addresses it reads and writes) and
`load_sae` for SAELens folders, Gemma Scope folders, EleutherAI sparsify folders, Hub ids of all
three, or tensors in memory. Loading is host code; the maths is `ie_core.experiments.sae_math`.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ie_core.errors import (
    DictionaryAddressError,
    DictionaryDtypeError,
    DictionaryFormatError,
    DictionaryShapeError,
)
from ie_core.experiments.sae_math import ACTIVATIONS, NORMALIZATIONS, DictMeta
from ie_core.grammar import POINTS, format_address, to_address

_KEYS = ("W_enc", "b_enc", "W_dec", "b_dec")


@dataclass(frozen=True, eq=False)
class SAE:
    """A dictionary: reads `address`, writes `out_address` (itself unless a transcoder)."""

    weights: Mapping[str, torch.Tensor]
    meta: DictMeta
    address: str
    out_address: str
    name: str = ""
    key: str = field(default="", init=False)

    def __post_init__(self) -> None:
        _check(self.weights, self.meta, self.address, self.out_address)
        object.__setattr__(self, "key", _digest(self.weights, self.meta))

    @property
    def d_in(self) -> int:
        return int(self.weights["W_enc"].shape[0])

    @property
    def d_sae(self) -> int:
        return int(self.weights["W_enc"].shape[1])

    @property
    def d_out(self) -> int:
        return int(self.weights["W_dec"].shape[1])

    @property
    def is_transcoder(self) -> bool:
        return self.out_address != self.address

    def decoder_row(self, feature: int) -> torch.Tensor:
        self.check_feature(feature)
        return self.weights["W_dec"][feature].float()

    def check_feature(self, feature: int) -> None:
        if not 0 <= int(feature) < self.d_sae:
            raise DictionaryShapeError(
                f"feature {feature} is outside this dictionary's 0..{self.d_sae - 1}"
            )


def _digest(weights: Mapping[str, torch.Tensor], meta: DictMeta) -> str:
    """A content key: two dictionaries share a worker-side copy only when equal bit for bit."""
    h = hashlib.sha256(json.dumps(meta.to_dict(), sort_keys=True).encode())
    for name in sorted(weights):
        t = weights[name].detach().to("cpu").contiguous()
        h.update(name.encode() + str(t.dtype).encode() + str(tuple(t.shape)).encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return "sae-" + h.hexdigest()[:24]


def _check(w: Mapping[str, torch.Tensor], meta: DictMeta, address: str, out: str) -> None:
    missing = [k for k in (*_KEYS, *(("threshold",) if meta.activation == "jumprelu" else ()))]
    missing = [k for k in missing if k not in w]
    if missing:
        raise DictionaryFormatError(f"the dictionary has no {', '.join(missing)} tensor")
    for name, t in w.items():
        if not isinstance(t, torch.Tensor) or not t.dtype.is_floating_point:
            raise DictionaryDtypeError(
                f"{name} is {getattr(t, 'dtype', type(t).__name__)}, not a floating-point "
                "tensor; pass float32 / bfloat16 / float16 weights"
            )
    if meta.activation not in ACTIVATIONS:
        raise DictionaryFormatError(
            f"activation {meta.activation!r} is not one of {', '.join(ACTIVATIONS)}"
        )
    if meta.normalize not in NORMALIZATIONS:
        raise DictionaryFormatError(
            f"input normalisation {meta.normalize!r} is not supported (only "
            f"{', '.join(NORMALIZATIONS)}); fold its scale into W_enc / W_dec and pass tensors"
        )
    if meta.activation == "topk" and (meta.k is None or meta.k < 1):
        raise DictionaryFormatError("a TopK dictionary needs k >= 1")
    enc, dec = w["W_enc"], w["W_dec"]
    if enc.dim() != 2 or dec.dim() != 2:
        raise DictionaryShapeError(
            f"W_enc {tuple(enc.shape)} and W_dec {tuple(dec.shape)} must be 2-D"
        )
    d_in, d_sae = enc.shape
    want = {"b_enc": (d_sae,), "W_dec": (d_sae, dec.shape[1]), "b_dec": (dec.shape[1],)}
    if meta.activation == "jumprelu":
        want["threshold"] = (d_sae,)
    for name, shape in want.items():
        if tuple(w[name].shape) != shape:
            raise DictionaryShapeError(
                f"{name} has shape {tuple(w[name].shape)}, expected {shape} for W_enc "
                f"{tuple(enc.shape)} ([d_in, d_sae]); a decoder stored [d_out, d_sae] must be "
                "transposed"
            )
    if meta.b_dec_in and dec.shape[1] != d_in:
        raise DictionaryShapeError(
            f"b_dec ({dec.shape[1]}) is subtracted from the {d_in}-wide input: widths differ"
        )
    if out == address and dec.shape[1] != d_in:
        raise DictionaryShapeError(
            f"an SAE reconstructs its input: d_out {dec.shape[1]} != d_in {d_in}; for a "
            "transcoder give out_address"
        )
    for a in (address, out):
        to_address(a)


# --- addresses ---------------------------------------------------------------------------------


def _tl_patterns() -> list[tuple[re.Pattern[str], str]]:
    """TransformerLens hook names -> our point names, from the point registry's peer names (the
    first point claiming a name wins: `hook_attn_out` is `attn_out`, not `attn_out_post`)."""
    seen: set[str] = set()
    out = []
    for p in POINTS:
        tl = p.peers.transformer_lens
        if tl is None or tl in seen:
            continue
        seen.add(tl)
        out.append((re.compile("^" + re.escape(tl).replace(r"\{L\}", r"(\d+)") + "$"), p.name))
    return out


def address_from_hook(hook_name: str) -> str:
    """`blocks.10.hook_resid_post` -> `resid_post.10` (TransformerLens names, as SAELens writes)."""
    # TransformerLens before 4 named a norm's output `ln2.hook_normalized` (SAELens transcoders
    # read it); the registry holds the current `ln2.hook_out`.
    hook_name = re.sub(r"\.(ln\d|ln_final)\.hook_normalized$", r".\1.hook_out", hook_name)
    for pattern, name in _tl_patterns():
        m = pattern.match(hook_name)
        if m:
            return format_address(to_address(f"{name}.{m.group(1)}" if m.groups() else name))
    raise DictionaryAddressError(
        f"hook name {hook_name!r} maps to no point (TransformerLens names such as "
        "'blocks.10.hook_resid_post'); pass address= to load_sae"
    )


def _sparsify_address(hookpoint: str) -> tuple[str, str]:
    """sparsify's module paths: `layers.N` is the block output, `layers.N.mlp` the MLP's."""
    m = re.fullmatch(r"(?:model\.|gpt_neox\.|transformer\.)?(?:layers|h)\.(\d+)(\.mlp)?", hookpoint)
    if m is None:
        raise DictionaryAddressError(
            f"sparsify hookpoint {hookpoint!r} maps to no point; pass address= to load_sae"
        )
    point = f"mlp_out.{m.group(1)}" if m.group(2) else f"resid_post.{m.group(1)}"
    return point, point


# --- loaders -------------------------------------------------------------------------------------


def from_tensors(
    weights: Mapping[str, Any],
    *,
    address: str,
    activation: str = "relu",
    k: int | None = None,
    b_dec_in: bool = False,
    normalize: str = "none",
    out_address: str | None = None,
    name: str = "",
) -> SAE:
    """A dictionary from tensors in memory (SAELens names and layouts)."""
    w = {n: torch.as_tensor(t) for n, t in weights.items() if t is not None}
    meta = DictMeta(activation, k, b_dec_in, normalize)
    return SAE(w, meta, _norm(address), _norm(out_address or address), name)


def _norm(address: str) -> str:
    return format_address(to_address(address))


def _saelens(folder: Path, address: str | None) -> SAE:
    from safetensors.torch import load_file

    cfg = json.loads((folder / "cfg.json").read_text())
    # SAELens 6 keeps hook names (and the sae id) under "metadata"; earlier versions at the top.
    cfg = {**(cfg.get("metadata") or {}), **cfg}
    w = load_file(str(folder / "sae_weights.safetensors"))
    arch = str(cfg.get("architecture", "standard"))
    if cfg.get("rescale_acts_by_decoder_norm"):
        raise DictionaryFormatError(
            "rescale_acts_by_decoder_norm is not supported (its TopK ranks activations scaled "
            "by decoder norms); fold the norms into W_enc / W_dec and save it without"
        )
    act_fn = str(cfg.get("activation_fn_str", cfg.get("activation_fn", "relu")))
    k = cfg.get("k", (cfg.get("activation_fn_kwargs") or {}).get("k"))
    if arch == "gated":
        raise DictionaryFormatError(
            "gated SAEs are not supported (their encoder has a separate gate path); use a "
            "ReLU, JumpReLU or TopK dictionary"
        )
    activation = {"jumprelu": "jumprelu", "topk": "topk", "batchtopk": "topk"}.get(arch)
    activation = activation or ("topk" if act_fn == "topk" else "relu")
    if "log_threshold" in w and "threshold" not in w:
        w["threshold"] = w.pop("log_threshold").exp()
    hook = cfg.get("hook_name")
    at = address or (address_from_hook(str(hook)) if hook else None)
    if at is None:
        raise DictionaryAddressError(f"{folder}/cfg.json names no hook_name; pass address=")
    out_hook = cfg.get("hook_name_out")
    out = address_from_hook(str(out_hook)) if out_hook else at
    norm = str(cfg.get("normalize_activations", "none") or "none")
    b_dec_in = bool(cfg.get("apply_b_dec_to_input", False)) and out == at
    return from_tensors(
        w, address=at, activation=activation, k=k, b_dec_in=b_dec_in, normalize=norm,
        out_address=out, name=str(cfg.get("sae_id") or folder.name),
    )  # fmt: skip


def _gemma_scope(folder: Path, address: str | None, hint: str) -> SAE:
    import numpy as np

    params = np.load(folder / "params.npz")
    w = {n: torch.from_numpy(params[n]) for n in params.files}
    at = address or _gemma_scope_address(hint or str(folder))
    out = at
    if "transcoder" in hint and address is None:
        layer = at.rsplit(".", 1)[1]
        at, out = f"mlp_in.{layer}", f"mlp_out.{layer}"
    return from_tensors(w, address=at, activation="jumprelu", out_address=out, name=folder.name)


def _gemma_scope_address(where: str) -> str:
    m = re.search(r"layer_(\d+)", where)
    kind = next((p for s, p in _SCOPE_KINDS if s in where), None)
    if m is None or kind is None:
        raise DictionaryAddressError(
            f"cannot tell the point of Gemma Scope dictionary {where!r} (the repo id names it, "
            "e.g. gemma-scope-2b-pt-res/layer_20/...); pass address="
        )
    return f"{kind}.{m.group(1)}"


_SCOPE_KINDS = (("-res", "resid_post"), ("-mlp", "mlp_out"), ("transcoder", "mlp_out"))


def _sparsify(folder: Path, address: str | None) -> SAE:
    from safetensors.torch import load_file

    cfg = json.loads((folder / "cfg.json").read_text())
    raw = load_file(str(folder / "sae.safetensors"))
    try:
        w = {
            "W_enc": raw["encoder.weight"].T.contiguous(),
            "b_enc": raw["encoder.bias"],
            "W_dec": raw["W_dec"],
            "b_dec": raw["b_dec"],
        }
    except KeyError as e:
        raise DictionaryFormatError(f"{folder}/sae.safetensors has no {e.args[0]} tensor") from None
    transcode = bool(cfg.get("transcode", False))
    at, out = (address, address) if address else _sparsify_address(folder.name)
    if transcode and address is None:
        at = f"mlp_in.{out.rsplit('.', 1)[1]}"
    return from_tensors(
        w, address=at, activation="topk", k=int(cfg["k"]), b_dec_in=not transcode,
        out_address=out, name=folder.name,
    )  # fmt: skip


def load_sae(
    source: str | Path | Mapping[str, Any],
    *,
    address: str | None = None,
    hub: Mapping[str, Any] | None = None,
    **options: Any,
) -> SAE:
    """Load a dictionary from a folder, a Hub id (`owner/repo[/sub/folder]`), or tensors.

    Folders: SAELens (`cfg.json` + `sae_weights.safetensors`), Gemma Scope (`params.npz`),
    EleutherAI sparsify (`cfg.json` + `sae.safetensors`, named for its hookpoint). `address`
    overrides the point a format names (and is required where it names none); `hub` passes
    `revision=`, `cache_dir=`, `token=`, `local_files_only=` to huggingface_hub."""
    if isinstance(source, Mapping):
        if address is None:
            raise DictionaryAddressError("tensors in memory need address= (the point they read)")
        return from_tensors(source, address=address, **options)
    folder = Path(source)
    hint = str(source)
    if not folder.exists():
        folder = _download(str(source), dict(hub or {}))
    if (folder / "sae_weights.safetensors").exists():
        return _saelens(folder, address)
    if (folder / "params.npz").exists():
        return _gemma_scope(folder, address, hint)
    if (folder / "sae.safetensors").exists():
        return _sparsify(folder, address)
    raise DictionaryFormatError(
        f"{folder} holds no sae_weights.safetensors (SAELens), params.npz (Gemma Scope) or "
        "sae.safetensors (sparsify)"
    )


def _download(source: str, hub: dict[str, Any]) -> Path:
    """A Hub id: `owner/repo` or `owner/repo/sub/folder` (the folder inside the repo)."""
    parts = source.split("/")
    if len(parts) < 2:
        raise DictionaryFormatError(f"{source!r} is neither a folder nor a Hub id (owner/repo)")
    from huggingface_hub import snapshot_download

    repo, sub = "/".join(parts[:2]), "/".join(parts[2:])
    pattern = [f"{sub}/*"] if sub else None
    root = Path(snapshot_download(repo, allow_patterns=pattern, **hub))
    return root / sub if sub else root


__all__ = ["SAE", "address_from_hook", "from_tensors", "load_sae"]
