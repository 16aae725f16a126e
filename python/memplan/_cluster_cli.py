"""``memplan cluster``: the deployment plan of a model on a running Ray cluster, from the
wheel's ``memplan`` script (the Rust binary has no Ray; this command is the Python
package's). Flags it does not know are ``memplan plan`` flags for every rank."""

from __future__ import annotations

import argparse
import json
import sys
from typing import List, NoReturn

from ._errors import MemplanError

USAGE = """memplan cluster --model NAME|PATH [--tp N] [--pp N] [--address ADDR] [--layouts]
                       [--timeout SECONDS] [--json] [PLAN FLAGS...]"""

DESCRIPTION = """\
Plan a model's deployment on a running Ray cluster: a probe/plan task runs on every free GPU,
placed as vLLM's Ray executor places its workers (one {GPU: 1} bundle per rank, PACK, the
driver's node first), and the ranks are combined by the fewest KV blocks. Prints, per node and
GPU, what is free and why, each rank's plan, the combined KV cache, the vLLM flags and the GPUs
that cannot host a rank. Needs `pip install 'memplan[ray]'` here and on every node.

Simulated GPUs: start a node with MEMPLAN_RAY_DEVICES="sim:h100-80gb sim:a100-80gb,other=4GiB"
(one memplan device per GPU the node declares with --num-gpus)."""

EPILOG = """\
Any other flag is a `memplan plan` flag for every rank (--max-model-len 32768,
--kv-cache-dtype fp8, --gpu-memory-utilization 0.9, ...).

exit codes: 0 the deployment fits, 1 it does not (or the cluster failed), 2 usage.

example:
  memplan cluster --address ray://head:10001 --model meta-llama/Llama-3.1-70B-Instruct \\
      --tp 8 --pp 2 --max-model-len 32768 --layouts"""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise MemplanError(f"memplan cluster: {message}", kind="usage", exit_code=2)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="memplan cluster",
        usage=USAGE,
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model", required=True, metavar="NAME|PATH", help="the model, as `memplan plan --model` takes it (readable on every node)")
    p.add_argument("--tp", "--tensor-parallel-size", dest="tp", type=int, default=1, metavar="N", help="tensor-parallel ranks per stage (default 1)")
    p.add_argument("--pp", "--pipeline-parallel-size", dest="pp", type=int, default=1, metavar="N", help="pipeline stages (default 1)")
    p.add_argument("--address", metavar="ADDR", help="the cluster: ray://HEAD:10001 or HEAD:6379 (default: RAY_ADDRESS, else this node's cluster)")
    p.add_argument("--layouts", action="store_true", help="also rank every TP x PP layout that fits the cluster, best first")
    p.add_argument("--timeout", type=float, default=120.0, metavar="SECONDS", help="for the whole run (default 120)")
    p.add_argument("--json", action="store_true", help="print the deployment plan as JSON (memplan.cluster/1)")
    return p


def _fail(e: MemplanError, as_json: bool) -> int:
    if as_json:
        env = dict(e.envelope)
        err = dict(env.get("error") or {})
        err.setdefault("kind", e.kind)
        err.setdefault("message", e.message)
        err["exit_code"] = e.exit_code
        err.setdefault("help", {})
        print(json.dumps({"schema": "memplan.error/1", "error": err}, indent=2))
    print(f"memplan: error: {e.message}", file=sys.stderr)
    return e.exit_code


def main(argv: List[str]) -> int:
    """Run ``memplan cluster ARGV``; returns the exit code."""
    as_json = "--json" in argv
    try:
        try:
            args, plan_argv = _parser().parse_known_args(argv)
        except SystemExit as e:  # --help printed
            return int(e.code or 0)
        from .ray import _plan_cluster

        doc = _plan_cluster(
            args.model, args.tp, args.pp, plan_argv, args.address, args.layouts, args.timeout
        )
    except MemplanError as e:
        return _fail(e, as_json)
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        from ._cluster import render

        print(render(doc))
    return 0 if doc["fits"] else 1
