"""The `hybrid-pd` command (pyproject.toml's [project.scripts]): one subcommand per process a user starts, each
a module's main(argv), imported only when named (the proxy's image has no vLLM, a worker's needs no proxy).

    hybrid-pd prefill [flags] [-- vLLM flags]   a prefill worker (KV producer)
    hybrid-pd decode  [flags] [-- vLLM flags]   a decode worker (KV consumer)
    hybrid-pd proxy   [flags]                   the OpenAI-compatible PD routing proxy
    hybrid-pd demo    [flags]                   1 prefill + 1 decode + proxy on 127.0.0.1, two requests, stop
    hybrid-pd build-model [--seed N]            build (or find) the tiny hybrid model; prints its folder
"""

from __future__ import annotations

import importlib
import sys

SUBCOMMANDS = {
    "prefill": "hybrid_pd.prefill.cli",
    "decode": "hybrid_pd.decode.cli",
    "proxy": "hybrid_pd.proxy.server",
    "demo": "hybrid_pd.prefill.dev.demo",
    "build-model": "hybrid_pd.prefill.dev.tiny_model",
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in SUBCOMMANDS:
        print(__doc__, file=sys.stderr if argv and argv[0] not in ("-h", "--help") else sys.stdout)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    module = importlib.import_module(SUBCOMMANDS[argv[0]])
    return module.main(argv[1:]) or 0


if __name__ == "__main__":
    sys.exit(main())
