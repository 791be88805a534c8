"""bench/calibrate_sim.py against the simulated replica: it must recover the settings the replica was started with."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import calibrate_sim as calibration
import pytest
from serving_support import SimProcesses

# Settings unlike the defaults, each term large enough to show in some probe; time runs at 1 s per second.
TRUE = {
    "step_base_s": 0.012,
    "step_per_token_s": 4e-5,
    # Decode alone cannot tell a sequence's cost from its token's (one token per sequence a step): the per-sequence
    # term is the decode slope less the prefill's per-token cost, so it must stand well out of the HTTP noise of a
    # decode step. At 2e-4 (10 ms at 48 sequences) a few ms of noise on a shared machine moved it past 35 %.
    "step_per_seq_s": 1e-3,
    "step_per_context_token_s": 2e-7,
    "step_per_token_pair_s": 5e-9,  # slow attention, so the quadratic term stands out of the HTTP noise
}
# 32 output tokens at least: a batch's requests start decoding a few steps apart (chunked prefill takes the long
# prompts in turn), and the difference of the two runs is one step's time only where both outlast that.
PROBES = calibration.Probes(prefill_prompts=(256, 1500, 3000, 4500, 6000),
                            decode_shapes=((1, 256), (24, 256), (48, 256), (1, 3000), (12, 2500)),
                            decode_outputs=(32, 128), repeats=2, overflow=1.5, overflow_output=256)
# By the engine's clock every probe is the model's own time, whatever else the host runs: the samples within ~1% at
# load 19-33, the per-context coefficient (a small part of every step) within 6%, the others within 1%.
TOLERANCE = {name: 0.15 for name in TRUE}


@pytest.mark.slow
def test_calibration_recovers_the_simulators_settings_and_its_recompute(tmp_path: Path) -> None:
    """The fit reads the engine's clock: the simulated replica reports its virtual time there, so other work on the
    host cannot move what is fitted (the client's clock carries the host's delays: a fit of it at load 20 missed the
    quadratic term by 38%). The client's clock is read too, and only ever adds to the engine's."""
    procs = SimProcesses(tmp_path)
    flags = [f"--{name.replace('_', '-')}={value}" for name, value in TRUE.items()]
    try:
        _, url = procs.start("--model", "m", "--time-scale", "1", "--num-gpu-blocks", "4096", "--max-model-len",
                             "8192", "--max-num-seqs", "48", *flags)
        out = asyncio.run(calibration.calibrate([url], None, 48, 8192, PROBES, clock=calibration.Clock.ENGINE))
    finally:
        procs.close()
    config = out["config"]
    assert (config.num_gpu_blocks, config.block_size, config.max_model_len, out["model"]) == (4096, 16, 8192, "m")
    recovered = {name: getattr(config, name) for name in TRUE}
    for name, value in TRUE.items():
        assert recovered[name] == pytest.approx(value, rel=TOLERANCE[name]), (name, recovered)
    prefill = [s for s in out["samples"] if s.kind == "prefill"]
    assert prefill and all(s.seconds >= s.engine_seconds > 0 for s in prefill)  # the client's time encloses it
    check = out["recompute"]
    assert check.live_preemptions >= 2 and check.sim_preemptions >= 2  # the check really overflowed the KV pool
    assert check.sim_mean_e2e_s == pytest.approx(check.live_mean_e2e_s, rel=0.15)


def test_the_fit_needs_enough_shapes() -> None:
    sample = calibration.Sample("decode", 8, 256, 0.01)
    with pytest.raises(ValueError, match="two batch sizes"):
        calibration.fit([sample, dataclasses.replace(sample, seconds=0.02)], PROBES, calibration.SimConfig())
