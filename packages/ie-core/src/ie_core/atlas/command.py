"""`ie atlas MODEL --dictionary D --corpus FILE... --out DIR` and `ie atlas merge A B --out C`.

Everything that can be refused without the model is refused before it loads: a missing corpus
file, a folder another command wrote (or another atlas: the fields that differ are named), a
dictionary with NaN / inf weights or whose point the model's config.json contradicts (width,
layer), an empty corpus, and (where the model's tokenizer is on disk) one shorter than a window.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from ie_core.harvest.windows import BOS_POLICIES, PACKINGS

__all__ = ["atlas_command"]

EPILOG = """Rerunning the same command resumes from the last checkpoint; a different command on the
same folder is refused, naming the difference. `ie atlas merge A B --out C` joins the folders of
disjoint --shard runs; `ie atlas neuronpedia DIR --out F.jsonl` exports Neuronpedia feature JSON,
`ie atlas delphi DIR --out LATENTS` delphi's latent cache.
Layout and reader: docs/HARVEST.md (Atlas)."""


def _parser() -> argparse.ArgumentParser:
    from ie_core.tooling.cli import DefaultsHelpFormatter

    p = argparse.ArgumentParser(
        prog="ie atlas",
        description="Every dictionary feature's top contexts, counts, histogram, band samples "
        "and logits over a corpus.",
        epilog=EPILOG,
        formatter_class=DefaultsHelpFormatter,
    )
    p.add_argument("model", help="model id or folder")
    p.add_argument("--dictionary", required=True, type=Path,
                   help="SAELens / Gemma Scope / sparsify folder, or circuit-tracer layer file")  # fmt: skip
    p.add_argument("--layer", type=int, help="a circuit-tracer transcoder folder's layer")
    p.add_argument("--corpus", "--data", dest="corpus", nargs="+", required=True, type=Path,
                   help=".txt / .jsonl / .parquet")  # fmt: skip
    p.add_argument("--out", required=True, type=Path, help="output folder")
    p.add_argument("--backend", default="auto", help="eager, vllm, vllm-static")
    p.add_argument("--column", default="text", help="the JSON-lines field / parquet column")
    p.add_argument("--context", type=int, default=128, help="rows per window")
    p.add_argument("--bos", choices=BOS_POLICIES, default="window", help="a BOS at each window")
    p.add_argument("--packing", choices=PACKINGS, default="packed", help="pack documents or not")
    p.add_argument("--max-tokens", type=int, help="stop after this many rows")
    p.add_argument("--top-k", type=int, default=20, help="top contexts kept per feature")
    p.add_argument("--samples", type=int, default=4, help="contexts sampled per activation band")
    p.add_argument("--logits", type=int, default=10, help="top and bottom decoder logits kept")
    p.add_argument("--shard", default="0/1", help="I/N: this run takes windows I, I+N, ...")
    p.add_argument("--batch-windows", type=int, help="windows per forward (eager 8, else 64)")
    p.add_argument("--checkpoint-windows", type=int, default=64, help="windows per checkpoint")
    p.add_argument("--dtype", help="eager: the model's dtype (float32, bfloat16)")
    p.add_argument("--max-model-len", type=int, help="vLLM backends: the engine's max_model_len")
    return p


def _merge_command(argv: list[str]) -> int:
    from ie_core.atlas.merging import merge_atlases

    p = argparse.ArgumentParser(
        prog="ie atlas merge", description="Join atlases of disjoint shards."
    )
    p.add_argument("a", type=Path)
    p.add_argument("b", type=Path)
    p.add_argument("--out", required=True, type=Path)
    args = p.parse_args(argv)
    out = merge_atlases(args.a, args.b, args.out, command=["ie", "atlas", "merge", *argv])
    print(f"{out}: merged {args.a} and {args.b}", file=sys.stdout)
    return 0


def _neuronpedia_command(argv: list[str]) -> int:
    from ie_core.atlas.neuronpedia import export_neuronpedia
    from ie_core.atlas.storage import read_manifest

    p = argparse.ArgumentParser(
        prog="ie atlas neuronpedia", description="Export an atlas as Neuronpedia feature JSON."
    )
    p.add_argument("atlas", type=Path)
    p.add_argument("--out", required=True, type=Path, help="a .jsonl file: one feature a line")
    p.add_argument("--model-id", help="Neuronpedia's model id (default: the atlas's model)")
    p.add_argument("--source", help="Neuronpedia's source id (default: the dictionary's name)")
    args = p.parse_args(argv)
    manifest = read_manifest(args.atlas)
    spec = manifest.spec if manifest is not None else {}
    decode = _decoder(str(spec.get("model", "")))
    out = export_neuronpedia(
        args.atlas, args.out, decode, model_id=args.model_id or str(spec.get("model")),
        source=args.source or _source_name(spec.get("dictionary") or {}),
    )  # fmt: skip
    print(f"{out}: Neuronpedia feature JSON", file=sys.stdout)
    return 0


def _delphi_command(argv: list[str]) -> int:
    from ie_core.atlas.delphi import export_delphi

    p = argparse.ArgumentParser(
        prog="ie atlas delphi",
        description="Export an atlas as delphi's latent cache (eai-delphi 0.1.3's layout): "
        "OUT/MODULE/config.json and <first>_<last>.safetensors feature ranges.",
    )
    p.add_argument("atlas", type=Path)
    p.add_argument("--out", required=True, type=Path, help="delphi's latents folder")
    p.add_argument("--module", help="the module folder's name (default: the dictionary's address)")
    p.add_argument("--splits", type=int, default=5, help="files of feature ranges")
    p.add_argument("--model", help="the tokenizer delphi loads (default: the atlas's model)")
    p.add_argument("--pad-token", type=int, default=0, help="id past a short window's end")
    args = p.parse_args(argv)
    out = export_delphi(
        args.atlas, args.out, module=args.module, splits=args.splits, model=args.model,
        pad_token=args.pad_token,
    )  # fmt: skip
    print(f"{out}: delphi latent cache", file=sys.stdout)
    return 0


def _source_name(dictionary: dict[str, Any]) -> str:
    return Path(dictionary["source"]).name if dictionary.get("source") else str(dictionary["name"])


def _decoder(model: str) -> Any:
    """One token id to its text, with the atlas's model's tokenizer (read from its folder)."""
    from ie_core.atlas.errors import AtlasError
    from ie_core.models import resolve_model_path

    folder = resolve_model_path(model) if model else None
    if folder is None:
        raise AtlasError(
            f"the tokenizer of {model!r} is not on this machine; the export decodes tokens with "
            "it: run it where the model's folder is"
        )
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    return lambda token: tokenizer.decode([token])


def _shard(text: str) -> tuple[int, int]:
    from ie_core.atlas.errors import AtlasError

    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise AtlasError(f"--shard {text!r} is not I/N (e.g. 0/4)") from None
    return i, n


def atlas_command(argv: list[str]) -> int:
    if argv[:1] == ["merge"]:
        return _merge_command(argv[1:])
    if argv[:1] == ["neuronpedia"]:
        return _neuronpedia_command(argv[1:])
    if argv[:1] == ["delphi"]:
        return _delphi_command(argv[1:])
    args = _parser().parse_args(argv)
    from ie_core.atlas.dictionary import check_against_config, read_dictionary
    from ie_core.atlas.running import atlas
    from ie_core.atlas.storage import check_folder
    from ie_core.harvest.corpus import describe_files
    from ie_core.harvest.storage import prepare_folder
    from ie_core.loading import load_model
    from ie_core.models import resolve_model_path
    from ie_core.runner import run

    describe_files(args.corpus)
    check_folder(args.out)
    sae = read_dictionary(args.dictionary, args.layer)
    folder = resolve_model_path(args.model)
    check_against_config(sae, folder)
    _check_folder_spec(args, sae)
    _precheck_corpus(args, folder)
    prepare_folder(args.out)
    extra: dict[str, Any] = {"max_model_len": args.max_model_len} if args.max_model_len else {}
    if args.dtype:
        extra["dtype"] = args.dtype
    model = load_model(args.model, backend=args.backend, **extra)
    try:
        result = atlas(
            model, sae, args.out, files=args.corpus, dictionary_source=args.dictionary,
            column=args.column, context=args.context, bos=args.bos, packing=args.packing,
            max_tokens=args.max_tokens, batch_windows=args.batch_windows, top_k=args.top_k,
            samples=args.samples, logits=args.logits, shard=_shard(args.shard),
            checkpoint_windows=args.checkpoint_windows, command=["ie", "atlas", *argv],
        )  # fmt: skip
    finally:
        run(model.shutdown())
    print(
        f"{result.out}: {sae.d_sae} features over {result.tokens} tokens "
        f"({result.resumed_windows} windows were already there)",
        file=sys.stdout,
    )
    return 0


def _check_folder_spec(args: argparse.Namespace, sae: Any) -> None:
    """A folder holding another atlas is refused, naming what differs, before the load."""
    from ie_core.atlas.storage import check_same_spec, read_manifest

    manifest = read_manifest(args.out)
    if manifest is None:
        return
    fields: dict[str, Any] = {
        "context": args.context, "bos": args.bos, "packing": args.packing,
        "max_tokens": args.max_tokens, "top_k": args.top_k, "samples": args.samples,
        "logits": args.logits, "shard": list(_shard(args.shard)),
        "checkpoint_windows": args.checkpoint_windows,
    }  # fmt: skip
    old = {k: manifest.spec.get(k) for k in fields}
    old["dictionary"] = (manifest.spec.get("dictionary") or {}).get("key")
    fields["dictionary"] = sae.key
    if args.backend != "auto":
        old["backend"], fields["backend"] = manifest.spec.get("backend"), args.backend
    check_same_spec(args.out, old, fields)


def _precheck_corpus(args: argparse.Namespace, folder: Path | None) -> None:
    """An empty corpus from the files alone; a corpus shorter than a window with the model's
    tokenizer where it is on disk (the exact check runs again after the load)."""
    from ie_core.harvest.corpus import iter_file_documents
    from ie_core.harvest.errors import CorpusError

    documents = (d for d in iter_file_documents(args.corpus, args.column) if d.strip())
    first = next(documents, None)
    if first is None:
        raise CorpusError("the corpus holds no text (every document is empty); pass a corpus")
    if folder is None or not (folder / "tokenizer.json").exists():
        return
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    head = len(tokenizer("").input_ids) if args.bos == "window" else 0
    seen = 0
    for text in (first, *documents):
        seen += len(tokenizer(text, add_special_tokens=False).input_ids)
        if seen >= args.context - head:
            return
    raise CorpusError(
        f"the corpus holds {seen} tokens, fewer than one window of --context {args.context}; "
        "pass more text or a smaller --context"
    )
