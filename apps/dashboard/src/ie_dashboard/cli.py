"""`ie dashboard`: serve the dashboard, seed its database, export the static site, take screenshots.

ie dashboard [serve] [--host H] [--port P] [--db PATH]   serve (seeds an empty database first)
             [--read-only]                                write nothing (automatic on an unwritable file)
             [--workers N]                                N server processes on one database
ie dashboard seed [--db PATH] [--root DIR]                refresh from ie-core and committed JSON
ie dashboard export [--out visualizer-web] [--db PATH]    write the static site
ie dashboard screenshots [--out docs/img] [--db PATH]     PNGs of the three pages
ie dashboard graph GRAPH.json... [--db PATH]              store `ie trace` graphs (exit 1 on a bad file)
ie dashboard atlas DIR... [--db PATH] [--scan NAME]       store finished `ie atlas` folders (feature pages)
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from ie_core.tooling.cli import DefaultsHelpFormatter, SuggestingParser

from ie_dashboard.config import DATABASE_ENV, READ_ONLY_ENV, database_url, default_db_path

COMMANDS = ("serve", "seed", "export", "screenshots", "graph", "atlas")


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of workers (1 or more)")
    return int(text)


def _parser() -> argparse.ArgumentParser:
    parser = SuggestingParser(
        prog="ie dashboard",
        description="Points cheat sheet, throughput cards and validation matrix (FastAPI + htmx + SQLite or PostgreSQL).",
        epilog=__doc__,
        formatter_class=DefaultsHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command")
    db_help = f"SQLite file or database URL (default: $DATABASE_URL, else {default_db_path()})"
    root_help = "workspace root holding benchmarks/ and validator/ (default: found from the working directory)"
    serve = sub.add_parser(
        "serve",
        formatter_class=DefaultsHelpFormatter,
        help="serve the dashboard (the default command)",
        description="Serve the dashboard. Writes (the ingest API) need a token: set "
        "IE_DASHBOARD_TOKEN=<secret> and send it as `Authorization: Bearer <secret>`; without "
        "the variable the ingest API is off and the pages are read only.",
    )
    serve.add_argument("--host", default="127.0.0.1", help="interface to listen on")
    serve.add_argument("--port", type=int, default=8000, help="TCP port")
    serve.add_argument("--db", help=db_help)
    serve.add_argument("--root", type=Path, help=root_help)
    serve.add_argument(
        "--read-only",
        action="store_true",
        help="open the database read-only: no migration, no seeding, the ingest API answers 403 "
        "(automatic when the database file is not writable)",
    )
    serve.add_argument(
        "--workers",
        type=_positive,
        default=1,
        help="uvicorn worker processes sharing the database (a postgresql:// URL for a team)",
    )
    seed = sub.add_parser(
        "seed",
        formatter_class=DefaultsHelpFormatter,
        help="seed or refresh the database from ie-core and the committed JSON",
    )
    seed.add_argument("--db", help=db_help)
    seed.add_argument("--root", type=Path, help=root_help)
    export = sub.add_parser(
        "export", formatter_class=DefaultsHelpFormatter, help="write the static site"
    )
    export.add_argument(
        "--out", type=Path, default=Path("visualizer-web"), help="folder for the static site"
    )
    export.add_argument(
        "--db", help="read this database instead of seeding a fresh one from the committed JSON"
    )
    export.add_argument("--root", type=Path, help=root_help)
    shots = sub.add_parser(
        "screenshots",
        formatter_class=DefaultsHelpFormatter,
        help="write PNG screenshots of the three pages",
    )
    shots.add_argument(
        "--out", type=Path, default=Path("docs/img"), help="folder for the PNG files"
    )
    shots.add_argument(
        "--db", help="read this database instead of seeding a fresh one from the committed JSON"
    )
    shots.add_argument("--root", type=Path, help=root_help)
    shots.add_argument(
        "--widths",
        default="",
        help="also each page at these window widths, e.g. 400,1400 (writes PAGE-WIDTH.png)",
    )
    graph = sub.add_parser(
        "graph",
        formatter_class=DefaultsHelpFormatter,
        help="store attribution graphs written by `ie trace --out` (shown under /graphs)",
        description="Store attribution graph JSON files (`ie trace`'s output) in the database. "
        "Each file is checked whole first; a malformed one is reported with its reason and "
        "nothing of it is stored. The same file twice is one graph.",
    )
    graph.add_argument("files", nargs="+", type=Path, help="graph JSON files")
    graph.add_argument("--db", help=db_help)
    atlas = sub.add_parser(
        "atlas",
        formatter_class=DefaultsHelpFormatter,
        help="store finished `ie atlas` folders (shown under /atlases)",
        description="Store finished `ie atlas` folders: one row per feature with its contexts "
        "(tokens decoded with the atlas's model's tokenizer), histogram, quantile samples and "
        "logits. A folder that is not a finished atlas is reported and nothing of it is "
        "stored. The same folder twice is one atlas. Needs torch and safetensors "
        "(ie-core[harvest]) and the model's tokenizer on this machine.",
    )
    atlas.add_argument("folders", nargs="+", type=Path, help="atlas folders (`ie atlas --out`)")
    atlas.add_argument("--db", help=db_help)
    atlas.add_argument(
        "--scan",
        help="the transcoder set's name, as graphs of it carry in metadata.scan (default: the "
        "set's config.yaml scan, else its folder's name), so a graph node links to its feature",
    )
    atlas.add_argument(
        "--tokenizer",
        help="model id or folder whose tokenizer decodes (default: the atlas's model)",
    )
    return parser


def _ingest_graphs(args: argparse.Namespace) -> int:
    """One transaction per file, so one bad file neither blocks nor half-writes the others."""
    from ie_dashboard.body import MAX_BODY, BodyError, parse_json
    from ie_dashboard.db import Database
    from ie_dashboard.graphs import SMALLER, GraphError
    from ie_dashboard.ingest import upsert_graph

    db = Database(database_url(args.db))
    db.migrate()
    failed = 0
    for path in args.files:
        try:
            if path.stat().st_size > MAX_BODY:
                size = path.stat().st_size
                raise GraphError(f"{size:,} bytes; the limit is {MAX_BODY:,}: {SMALLER}")
            data = parse_json(path.read_bytes())
            with db.write() as session:
                row_id, created = upsert_graph(session, data, source=str(path))
        except (OSError, BodyError, GraphError) as exc:
            print(f"ie dashboard graph: {path}: {exc}", file=sys.stderr)
            failed += 1
            continue
        print(f"{path}: graph {row_id} ({'stored' if created else 'already stored'})")
    db.dispose()
    return 1 if failed else 0


def _ingest_atlases(args: argparse.Namespace) -> int:
    """One transaction per folder, as `graph` does per file."""
    from ie_core.errors import InterpError

    from ie_dashboard.atlas_import import import_atlas, token_decoder
    from ie_dashboard.db import Database

    db = Database(database_url(args.db))
    db.migrate()
    failed = 0
    for folder in args.folders:
        try:
            from ie_core.atlas.storage import read_manifest

            manifest = read_manifest(folder) if folder.is_dir() else None
            model = args.tokenizer or (str(manifest.spec.get("model")) if manifest else "")
            # An unfinished folder is refused by the import, before any token is decoded.
            decode = token_decoder(model) if manifest and manifest.complete else str
            with db.write() as session:
                row_id, created = import_atlas(session, folder, decode, scan=args.scan)
        except (OSError, ValueError, ImportError, InterpError) as exc:
            print(f"ie dashboard atlas: {folder}: {exc}", file=sys.stderr)
            failed += 1
            continue
        print(f"{folder}: atlas {row_id} ({'stored' if created else 'already stored'})")
    db.dispose()
    return 1 if failed else 0


def _fresh_db(tmp: str, root: Path | None):  # type: ignore[no-untyped-def]
    """A throwaway SQLite file seeded from the committed JSON, so outputs depend only on the repo."""
    from ie_dashboard.db import Database
    from ie_dashboard.seed import find_repo_root, seed

    db = Database(database_url(Path(tmp) / "dashboard.sqlite"))
    report = seed(db, root or find_repo_root())
    print(report.summary(), file=sys.stderr)
    return db, report


def dashboard_command(argv: list[str]) -> int:
    argv = list(argv)
    if not argv or (argv[0] not in COMMANDS and argv[0] not in {"-h", "--help"}):
        argv = ["serve", *argv]
    args = _parser().parse_args(argv)
    from ie_dashboard.db import DatabaseError

    try:
        return _run(args)
    except DatabaseError as exc:
        print(f"ie dashboard: {exc}", file=sys.stderr)
        return 2


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from ie_dashboard.app import create_app
    from ie_dashboard.db import Database
    from ie_dashboard.seed import find_repo_root, is_empty, seed

    db = Database(database_url(args.db), read_only=True if args.read_only else None)
    db.migrate()
    if not db.read_only and is_empty(db):
        print(seed(db, args.root or find_repo_root()).summary(), file=sys.stderr)
    mode = " read-only" if db.read_only else ""
    workers = f", {args.workers} workers" if args.workers > 1 else ""
    print(
        f"ie dashboard: serving {db.label}{mode} on http://{args.host}:{args.port}{workers}",
        file=sys.stderr,
    )
    if args.workers > 1:
        # Each worker process builds its own app (and engine) from the environment.
        os.environ[DATABASE_ENV] = db.url
        os.environ[READ_ONLY_ENV] = "1" if db.read_only else "0"
        db.dispose()
        uvicorn.run(
            "ie_dashboard.app:create_app_from_env",
            factory=True,
            workers=args.workers,
            host=args.host,
            port=args.port,
            log_level="info",
        )
        return 0
    uvicorn.run(create_app(db), host=args.host, port=args.port, log_level="info")
    return 0


def _run(args: argparse.Namespace) -> int:
    from ie_dashboard.db import Database
    from ie_dashboard.seed import find_repo_root, seed

    if args.command == "serve":
        return _serve(args)
    if args.command == "graph":
        return _ingest_graphs(args)
    if args.command == "atlas":
        return _ingest_atlases(args)
    if args.command == "seed":
        db = Database(database_url(args.db))
        report = seed(db, args.root or find_repo_root())
        print(report.summary())
        return 1 if report.errors else 0
    with tempfile.TemporaryDirectory(prefix="ie-dashboard-") as tmp:
        if args.db:
            db, failed = Database(database_url(args.db)), False
            db.migrate()
        else:
            db, report = _fresh_db(tmp, args.root)
            failed = bool(report.errors)
        if args.command == "export":
            from ie_dashboard.export import ExportError, export_site

            try:
                n = export_site(db, args.out)
            except ExportError as exc:
                print(f"ie dashboard export: {exc}", file=sys.stderr)
                return 2
            print(f"wrote {n} files to {args.out}")
        else:
            from ie_dashboard.screenshots import take_screenshots

            widths = tuple(int(w) for w in args.widths.split(",") if w.strip())
            for path in take_screenshots(db, args.out, widths=widths):
                print(f"wrote {path}")
        db.dispose()
    return 1 if failed else 0
