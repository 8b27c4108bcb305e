"""The held-out sets added for issue #38 items 4-5 (bench/llama_fsdp.py, bench/xla_gemm.py and their data): the data
read as their sources publish them, every row can be priced, and the XLA table's parser keeps XLA's convention.
No capture and no prediction of a whole step here (the benches do those)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from _support import load_path

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def llama():
    return load_path("bench_llama_fsdp", ROOT / "bench" / "llama_fsdp.py")


@pytest.fixture(scope="module")
def xla_builder():
    return load_path("build_xla_gemm_data", ROOT / "scripts" / "build_xla_gemm_data.py")


def test_llama_rows_map_onto_the_model(llama) -> None:
    from predictor.catalog.catalog import Catalog
    from predictor.model.layout import parse

    rows = llama.load_rows()
    assert len(rows) == 12 and {r["source"].split()[0] for r in rows} == {"torchtitan", "fms-fsdp"}
    catalog = Catalog.load(extra=[str(llama.NODES)])
    for r in rows:
        assert r["activation_checkpointing"] in llama.RECOMPUTE, r
        parse(llama.SHARDING[r["sharding"]])  # a layout the model knows
        assert catalog.get(llama.FLEET_TYPE[r["gpu"]]).gpus == 8
        assert int(r["gpus"]) % 8 == 0
        cfg = llama.config_of(r)
        assert cfg["num_attention_heads"] % cfg["num_key_value_heads"] == 0
    # torchtitan's MFU column agrees with its tokens/s (the rows were copied with the right model and scale): its
    # FLOPs per token are 6N plus 12 x layers x hidden x sequence for attention, at 312 TFLOP/s bf16
    params = {"llama3-8b": 8.03e9, "llama3-70b": 70.6e9, "llama2-13b": 13.0e9, "llama2-70b": 69.0e9}
    for r in rows:
        if r["mfu_percent"]:
            per_token = 6 * params[r["model"]] + 12 * int(r["layers"]) * int(r["hidden"]) * int(r["seq_len"])
            mfu = per_token * float(r["tokens_s_gpu"]) / 312e12
            assert mfu == pytest.approx(float(r["mfu_percent"]) / 100, rel=0.03), r


def test_xla_parser_keeps_the_published_numbers(xla_builder) -> None:
    text = """
    entries { key: "sm_90" value {
      entries { b: 1 m: 4096 n: 4096 k: 4096
        flops { key: "bf16xbf16->bf16" value: 783328793548203 }
        flops { key: "f32xf32->f32" value: 401589990188086 } }
      entries { b: 2 m: 256 n: 512 k: 1024
        flops { key: "f8e4m3fnxf8e4m3fn->bf16" value: 1 } } } }
    entries { key: "sm_100_B200" value {
      entries { b: 4 m: 256 n: 256 k: 256
        flops { key: "bf16xbf16->bf16" value: 12 } } } }
    """
    rows = xla_builder.parse(text)
    assert [(r["gpu"], r["b"], r["m"], r["n"], r["k"]) for r in rows] == [
        ("H100-SXM", 1, 4096, 4096, 4096),
        ("H100-SXM", 2, 256, 512, 1024),
        ("B200-SXM", 4, 256, 256, 256),
    ]
    assert rows[0]["bf16_flops"] == "783328793548203" and rows[0]["f32_flops"] == "401589990188086"
    assert rows[1]["bf16_flops"] == "" and rows[2]["f32_flops"] == ""  # a dtype not measured stays empty


def test_xla_data_file_is_the_grid_xla_publishes() -> None:
    with (ROOT / "bench" / "data" / "xla_matmul_rates.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    for gpu in ("H100-SXM", "B200-SXM"):
        mine = [r for r in rows if r["gpu"] == gpu]
        assert len(mine) == 375  # b in {1, 2, 4} x m, n, k in {256 .. 4096}
        assert {int(r["k"]) for r in mine} == {256, 512, 1024, 2048, 4096}
    top = next(
        r for r in rows if r["gpu"] == "H100-SXM" and (r["b"], r["m"], r["n"], r["k"]) == ("1", "4096", "4096", "4096")
    )
    assert float(top["bf16_flops"]) / 989e12 == pytest.approx(0.79, abs=0.01)  # of the H100 SXM's dense bf16 peak
