"""`ie harvest` on the eager backend (synthetic Llama, fp32 CPU): rows against one-window
captures (1e-5), token ids against the tokenizer, resume and refusals, the reader, and SIGKILLs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from eager_harvest_support import OPTIONS, POINTS, write_corpus
from eager_support import synthetic_model
from ie_core import capture
from ie_core.harvest import (
    CorpusError,
    HarvestError,
    HarvestMismatchError,
    OutputFolderError,
    harvest,
    open_harvest,
)

WITHIN = 1e-5


@pytest.fixture(scope="module")
def model() -> Any:
    return synthetic_model("llama")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    return path, write_corpus(path)


@pytest.fixture(scope="module")
def harvested(model: Any, corpus: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("harvest") / "out"
    harvest(model, out, POINTS, files=[corpus[0]], progress=False, **OPTIONS)
    return out


def _relative(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).abs().max() / want.abs().max().clamp_min(1.0))


def test_rows_equal_one_window_captures(model: Any, harvested: Path) -> None:
    data = open_harvest(harvested)
    assert data.complete and data.tokens == OPTIONS["max_tokens"]
    assert len(data.manifest.shards) >= 5
    generator = torch.Generator().manual_seed(0)
    for shard in data.iter_shards():
        rows = torch.randint(len(shard["token_ids"]), (3,), generator=generator).tolist()
        for row in rows:
            window = shard["window"] == shard["window"][row]
            ids = shard["token_ids"][window].tolist()
            cache = capture(model, [ids], POINTS)
            position = int(shard["position"][row])
            for point in POINTS:
                want = cache[point][0, position]
                assert _relative(shard[point][row], want) < WITHIN
                # Negative control: the same position one token later in the window differs.
                if position + 1 < len(ids):
                    assert _relative(cache[point][0, position + 1], want) > 1e-3


def test_token_ids_equal_the_tokenizer(model: Any, corpus: Any, harvested: Path) -> None:
    data = open_harvest(harvested)
    shards = list(data.iter_shards([]))
    ids = torch.cat([s["token_ids"] for s in shards])
    docs = torch.cat([s["document"] for s in shards])
    position = torch.cat([s["position"] for s in shards])
    bos = model.to_tokens("")  # the tokenizer's own BOS
    assert bos and (ids[position == 0] == bos[0]).all() and (docs[position == 0] == -1).all()
    body, owners = ids[docs >= 0], docs[docs >= 0]
    want = [t for d, text in enumerate(corpus[1]) for t in model.to_tokens(text, prepend_bos=False)]
    assert body.tolist() == want[: len(body)]
    last = int(owners[-1])
    assert owners.tolist() == sorted(owners.tolist()) and last > 10


def test_document_packing_starts_each_document_a_window(model: Any, tmp_path: Path) -> None:
    docs = ["alpha beta gamma delta " * 5, "one two", "x y z " * 9]
    out = tmp_path / "docs"
    harvest(
        model, out, ["resid_post.0"], documents=docs, context=16, packing="document", progress=False
    )
    shard = next(open_harvest(out).iter_shards())
    starts = shard["document"][shard["position"] == 1].tolist()
    assert starts[0] == 0 and 1 in starts and 2 in starts
    per_doc = [model.to_tokens(d, prepend_bos=False) for d in docs]
    for d, want in enumerate(per_doc):
        assert shard["token_ids"][shard["document"] == d].tolist() == want


def test_same_command_resumes_and_another_is_refused(
    model: Any, corpus: Any, harvested: Path, tmp_path: Path
) -> None:
    out = tmp_path / "resume"
    options = {**OPTIONS, "max_tokens": 300}
    full = harvest(model, out, POINTS, files=[corpus[0]], progress=False, **options)
    manifest = json.loads((out / "manifest.json").read_text())
    before = (out / manifest["shards"][0]["file"]).read_bytes()
    manifest["shards"], manifest["complete"] = manifest["shards"][:1], False
    (out / "manifest.json").write_text(json.dumps(manifest))
    again = harvest(model, out, POINTS, files=[corpus[0]], progress=False, **options)
    assert (again.resumed_shards, again.shards, again.tokens) == (1, full.shards, 300)
    assert (out / manifest["shards"][0]["file"]).read_bytes() == before
    with pytest.raises(
        HarvestMismatchError, match="context: folder has 24, this command 32"
    ) as err:
        harvest(model, out, POINTS, files=[corpus[0]], progress=False, **{**options, "context": 32})
    assert set(err.value.differences) == {"context"}
    with pytest.raises(HarvestMismatchError, match="points"):
        harvest(model, out, ["resid_post.0"], files=[corpus[0]], progress=False, **options)


def test_bad_input_is_refused_before_work(model: Any, tmp_path: Path) -> None:
    with pytest.raises(CorpusError, match="does not exist"):
        harvest(model, tmp_path / "a", POINTS, files=[tmp_path / "missing.txt"])
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"body": "x"}\n')
    with pytest.raises(CorpusError, match=r"no string field 'text'.*--column"):
        harvest(model, tmp_path / "b", POINTS, files=[bad], progress=False)
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(OutputFolderError, match="cannot write the output folder"):
        harvest(model, blocker / "sub", POINTS, documents=["x"], progress=False)
    with pytest.raises(HarvestError, match=r"attn_probs.0 gives heads x q x k per token"):
        harvest(model, tmp_path / "c", ["attn_probs.0"], documents=["x"], progress=False)
    assert not (tmp_path / "c").exists()
    assert not (tmp_path / "a").exists() or not any((tmp_path / "a").glob("shard-*"))


def test_jsonl_and_parquet_give_the_text_files_rows(model: Any, tmp_path: Path) -> None:
    docs = ["first document here", "the second one — naïve", "third"]
    (tmp_path / "c.jsonl").write_text("".join(json.dumps({"body": d}) + "\n" for d in docs))
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    pq.write_table(pa.table({"body": docs}), tmp_path / "c.parquet")
    (tmp_path / "c.txt").write_text("\n\n".join(docs))
    got = {}
    for name, column in (("c.txt", "text"), ("c.jsonl", "body"), ("c.parquet", "body")):
        harvest(
            model,
            tmp_path / name.replace(".", "-"),
            ["resid_post.0"],
            files=[tmp_path / name],
            column=column,
            progress=False,
        )
        got[name] = next(open_harvest(tmp_path / name.replace(".", "-")).iter_shards())
    for name in ("c.jsonl", "c.parquet"):
        assert torch.equal(got[name]["token_ids"], got["c.txt"]["token_ids"])
        assert torch.equal(got[name]["resid_post.0"], got["c.txt"]["resid_post.0"])


def test_reader_shuffles_every_row_once(harvested: Path) -> None:
    data = open_harvest(harvested)
    rows = torch.cat([s["resid_post.1"] for s in data.iter_shards(["resid_post.1"])])
    batches = list(data.shuffled("resid_post.1", 64, buffer_tokens=300, seed=1))
    mixed = torch.cat(batches)
    assert all(len(b) == 64 for b in batches[:-1]) and len(mixed) == len(rows)
    assert not torch.equal(mixed, rows)
    key = lambda t: sorted(map(tuple, t.tolist()))  # noqa: E731
    assert key(mixed) == key(rows)


def test_bf16_on_disk_is_the_fp32_rows_rounded(
    model: Any, harvested: Path, tmp_path: Path, corpus: Any
) -> None:
    out = tmp_path / "bf16"
    harvest(
        model,
        out,
        POINTS,
        files=[corpus[0]],
        progress=False,
        **{**OPTIONS, "max_tokens": 100, "dtype": "bf16"},
    )
    half = next(open_harvest(out).iter_shards())
    full = next(open_harvest(harvested).iter_shards())
    n = len(half["token_ids"])
    assert half["resid_post.1"].dtype == torch.bfloat16
    assert torch.equal(half["resid_post.1"], full["resid_post.1"][:n].to(torch.bfloat16))


def test_sigkill_at_random_moments_then_resume_equals_an_uninterrupted_run(tmp_path: Path) -> None:
    out, ref = tmp_path / "killed", tmp_path / "reference"
    script = Path(__file__).with_name("eager_harvest_support.py")
    done = subprocess.run(
        [sys.executable, str(script), str(out), str(ref), "7"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    kills = report["kills"]
    assert len(kills) >= 6 and all(k["killed"] for k in kills)
    assert any(any(n.startswith(".shard-") for n in k["half_written"]) for k in kills)
    assert report["resume_rc"] == 0 and report["ref_rc"] == 0
    got, want = open_harvest(out), open_harvest(ref)
    assert got.complete and got.manifest.shards == want.manifest.shards
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in ref.iterdir())
    for a, b in zip(got.iter_shards(), want.iter_shards(), strict=True):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_cli_refuses_a_missing_file_before_loading_and_importing_stays_torch_free(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from ie_core.tooling.cli import main

    argv = ["harvest", "no-such-model", "--data", str(tmp_path / "missing.txt")]
    code = main([*argv, "--points", "resid_post.0", "--out", str(tmp_path / "o")])
    assert code == 1
    assert "CorpusError" in capsys.readouterr().err and not (tmp_path / "o").exists()
    probe = "import sys, ie_core.harvest, ie_core.harvest.command; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def test_cli_answers_a_complete_or_mismatched_folder_without_loading_the_model(
    corpus: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A rerun of a finished harvest says "nothing to do" and a different command is refused,
    both before the model loads (each used to load it first: 13-14 s on SmolLM2)."""
    import ie_core.loading
    from ie_core.tooling.cli import main

    out = tmp_path / "out"
    argv = ["harvest", "ie-synthetic/llama", "--backend", "eager", "--data", str(corpus[0])]
    argv += ["--points", "resid_post.0", "--out", str(out), "--context", "16", "--max-tokens", "64"]
    assert main(argv) == 0
    capsys.readouterr()

    def no_load(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(ie_core.loading, "load_model", no_load)
    assert main(argv) == 0
    assert "complete (nothing to do; the model was not loaded)" in capsys.readouterr().out
    assert main([*argv, "--context", "32"]) == 1
    err = capsys.readouterr().err
    assert "HarvestMismatchError" in err and "context: folder has 16, this command 32" in err
    # Negative control: an unfinished folder still needs the model, so it loads.
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["complete"] = False
    (out / "manifest.json").write_text(json.dumps(manifest))
    assert main(argv) == 1
    assert "the model was loaded" in capsys.readouterr().err


def test_the_default_batch_is_the_backends_own(model: Any) -> None:
    """ie-core reads the default from the backend's descriptor (eager's 8), not from a table of
    backend names; an unknown backend gets the descriptor's default (64)."""
    from dataclasses import dataclass

    from ie_core.harvest.spec import HarvestOptions

    assert HarvestOptions.make(model, ("resid_post.1",), ()).batch_windows == 8

    @dataclass
    class Elsewhere:  # a model whose backend is not installed here
        backend = "not-installed"

        def point_width(self, _: str) -> int:
            return 4

    assert HarvestOptions.make(Elsewhere(), ("resid_post.1",), ()).batch_windows == 64
