"""The wheel's `memplan` script, and the API's answers against the CLI's `--json`."""

from __future__ import annotations

import json
from typing import Any, Dict, List

import pytest

import memplan
from conftest import DEVICE, MODEL, run

# (API keywords, the same as CLI flags)
CASES: List[Dict[str, Any]] = [
    {},
    {"gpu_memory_utilization": 0.8, "max_model_len": 8192},
    {"kv_cache_dtype": "fp8", "tensor_parallel_size": 2},
    {"enforce_eager": True, "block_size": 32},
    {"cudagraph_capture_sizes": [1, 2, 4, 8], "max_num_seqs": 64},
    {"kv_cache_memory_bytes": "8GiB"},
    {"mamba_ssm_cache_dtype": "float16", "mamba_cache_dtype": "float32"},
    {"engine": "sglang"},  # a flag the API has no named keyword for: passed through
    {"alloc_conf": "expandable_segments:True,max_split_size_mb:512"},
]


def flags(kw: Dict[str, Any]) -> List[str]:
    out: List[str] = []
    for k, v in kw.items():
        name = "--" + k.replace("_", "-")
        if v is True:
            out.append(name)
        elif isinstance(v, list):
            out += [name, ",".join(map(str, v))]
        else:
            out += [name, str(v)]
    return out


@pytest.mark.parametrize("kw", CASES, ids=lambda kw: ",".join(kw) or "defaults")
def test_plan_equals_the_cli_json(kw: Dict[str, Any], clis: List[str]) -> None:
    api = memplan.plan(model=MODEL, device=DEVICE, **kw)
    for cli in clis:
        cmd = [cli, "plan", "--model", MODEL, "--device", DEVICE, *flags(kw), "--json"]
        code, out, err = run(cmd)
        assert code == 0, err
        assert api == out, f"{cmd}: the API and the CLI disagree"


def test_devices_probe_simulate_equal_the_cli_json(clis: List[str]) -> None:
    for cli in clis:
        assert run([cli, "devices", "--json"])[1] == memplan.backends()
        assert run([cli, "probe", DEVICE, "--json"])[1] == memplan.probe(DEVICE)
        sim = run([cli, "simulate", "--scenario", "shared-pool", "--json"])[1]
        assert sim == memplan.simulate("shared-pool")
        seeded = run([cli, "simulate", "--scenario", "shared-pool", "--seed", "7", "--json"])[1]
        assert seeded == memplan.simulate("shared-pool", seed=7)


def test_an_error_equals_the_cli_error(clis: List[str]) -> None:
    with pytest.raises(memplan.MemplanError) as info:
        memplan.plan(MODEL, DEVICE, gpu_memory_utilization=1.5)
    for cli in clis:
        cmd = [cli, "plan", "--model", MODEL, "--device", DEVICE]
        code, out, err = run(cmd + ["--gpu-memory-utilization", "1.5", "--json"])
        assert code == info.value.exit_code == 2
        assert "1.5" in (json.dumps(out) + err)


def test_script_runs_plan_json(script: str) -> None:
    code, out, err = run([script, "plan", "--model", MODEL, "--device", DEVICE, "--json"])
    assert code == 0, err
    assert out["kv_cache_tokens"] > 0


def test_script_prints_tables_and_vllm_flags(script: str) -> None:
    code, out, _ = run([script, "plan", "--model", MODEL, "--device", DEVICE, "--emit-args", "vllm"])
    assert code == 0
    assert out.startswith("--kv-cache-memory-bytes ")
    assert out.strip() == memplan.plan(MODEL, DEVICE)["engine_args"]["vllm"]
    code, out, _ = run([script, "devices"])
    assert code == 0 and "sim:rtx4090" in out


def test_script_exit_codes(script: str) -> None:
    assert run([script, "--version"])[0] == 0
    assert memplan.__version__ in run([script, "--version"])[1]
    assert run([script, "plan", "--model", MODEL])[0] == 2  # no device, no total
    assert run([script, "no-such-command"])[0] == 2
    code, _, err = run([script, "plan", "--model", MODEL, "--total-memory", "2GiB"])
    assert code == 1 and "does not fit" in err


def test_main_returns_the_exit_code(capsys: pytest.CaptureFixture[str]) -> None:
    assert memplan.main(["plan", "--model", MODEL, "--gpu-memory-utilization", "2"]) == 2
