"""Diagnosis findings: thresholds, levers with numbers, ordering."""

import pytest

from scaletrain.analysis.diagnosis import DEFAULT_THRESHOLDS, diagnose, thresholds_from


def _run(**phases):
    full = dict.fromkeys(("data_wait", "h2d", "forward", "backward", "comm_exposed", "optimizer", "other"), 0.0)
    full.update(phases)
    return {"phases_mean_s": full, "step_time_mean_s": sum(full.values()), "overlap_ratio": 0.2}


NO_STRAGGLERS = {"repeated": []}


def test_input_bound_names_the_share_and_the_workers_lever():
    findings = diagnose(_run(data_wait=0.031, forward=0.03, backward=0.039), NO_STRAGGLERS,
                        {"workers": 2}, DEFAULT_THRESHOLDS)
    assert findings[0]["kind"] == "input-bound"
    assert "31% of each step" in findings[0]["message"] and "2 loader workers per rank" in findings[0]["message"]
    assert "--workers 4" in findings[0]["lever"]


def test_communication_bound_with_low_overlap_suggests_smaller_buckets():
    findings = diagnose(_run(comm_exposed=0.05, forward=0.02, backward=0.03), NO_STRAGGLERS,
                        {"bucket_cap_mb": 25.0, "batch_size": 64, "gradient_buckets": True,
                         "gradient_bytes": 100 * 2 ** 20}, DEFAULT_THRESHOLDS)
    assert [f["kind"] for f in findings] == ["communication-bound"]
    assert "--bucket-cap-mb 6.25" in findings[0]["lever"] and "--batch-size 128" in findings[0]["lever"]


def test_straggler_names_the_rank():
    stragglers = {"repeated": [{"rank": 3, "share": 0.9, "lag_mean_s": 0.02}]}
    findings = diagnose(_run(forward=0.04, backward=0.06), stragglers, {}, DEFAULT_THRESHOLDS)
    assert findings[0]["kind"] == "straggler" and findings[0]["rank"] == 3
    assert "rank 3" in findings[0]["message"] and "90%" in findings[0]["message"]
    # ranks that do not step together (the run's lockstep fact: ps-async) hold no one back
    apart = diagnose(_run(forward=0.04, backward=0.06), stragglers, {"lockstep": False}, DEFAULT_THRESHOLDS)
    assert apart and all(f["kind"] != "straggler" for f in apart)


def test_compute_bound_when_nothing_else_and_only_then():
    findings = diagnose(_run(forward=0.04, backward=0.05, optimizer=0.005, data_wait=0.005), NO_STRAGGLERS,
                        {"device": "cuda", "precision": "fp32"}, DEFAULT_THRESHOLDS)
    assert [f["kind"] for f in findings] == ["compute-bound"]
    assert "95%" in findings[0]["message"] and "bf16" in findings[0]["lever"]


def test_findings_are_ordered_by_share():
    findings = diagnose(_run(data_wait=0.02, comm_exposed=0.04, forward=0.04), NO_STRAGGLERS, {}, DEFAULT_THRESHOLDS)
    assert [f["kind"] for f in findings] == ["communication-bound", "input-bound"]


def test_thresholds_come_from_config_and_can_be_overridden():
    limits = thresholds_from({"diag_input": 0.3}, {"diag_comm": 0.5})
    assert limits == {"diag_input": 0.3, "diag_comm": 0.5, "diag_straggler": 0.10, "diag_cpu_util": 0.6,
                      "diag_cpu_spread": 3.0}
    findings = diagnose(_run(data_wait=0.02, forward=0.08), NO_STRAGGLERS, {}, limits)
    assert [f["kind"] for f in findings] == ["compute-bound"]  # 20% data wait is under a 30% threshold


def test_unprofiled_run_gets_no_diagnosis():
    assert diagnose({"phases_mean_s": None, "step_time_mean_s": 0.1}, NO_STRAGGLERS, {}, DEFAULT_THRESHOLDS) == []


def test_a_straggler_while_oversubscribed_comes_after_it_and_says_so():
    stragglers = {"repeated": [{"rank": 1, "share": 0.9, "lag_mean_s": 0.06}]}
    cpu = {"threads_per_rank": 2, "local_world_size": 2, "cpu_cores": 2, "utilisation": None, "spread": {}}
    findings = diagnose({**_run(forward=0.02, backward=0.02), "cpu": cpu}, stragglers, {}, DEFAULT_THRESHOLDS)
    assert [f["kind"] for f in findings] == ["cpu-oversubscribed", "straggler"]
    assert "likely inflated by the CPU oversubscription" in findings[1]["message"]
    assert diagnose({**_run(forward=0.02, backward=0.02), "cpu": None}, stragglers, {},
                    DEFAULT_THRESHOLDS)[0]["kind"] == "straggler"


def test_pipeline_bound_at_theory_suggests_more_microbatches():
    # K=2, M=4: theory's bubble is 1/5; measured 0.02 of a 0.1 s step = 20%
    findings = diagnose(_run(forward=0.03, backward=0.04, bubble=0.02, p2p=0.01), NO_STRAGGLERS,
                        {"stages": 2, "microbatches": 4, "split": "auto"}, DEFAULT_THRESHOLDS)
    assert [f["kind"] for f in findings] == ["pipeline-bound"]
    assert findings[0]["share"] == 0.3 and "theory (K-1)/(M+K-1) = 20%" in findings[0]["message"]
    assert "--microbatches 8" in findings[0]["lever"] and "from 20% to 11%" in findings[0]["lever"]


def test_pipeline_bound_far_above_theory_suggests_a_balanced_split():
    findings = diagnose(_run(forward=0.02, backward=0.03, bubble=0.05), NO_STRAGGLERS,
                        {"nproc": 2, "microbatches": 8, "split": "uniform"}, DEFAULT_THRESHOLDS)
    assert findings[0]["kind"] == "pipeline-bound" and "--split auto" in findings[0]["lever"]
    assert "4.5x theory's" in findings[0]["lever"]  # 50% measured against 1/9


def test_a_small_bubble_is_no_finding():
    findings = diagnose(_run(forward=0.05, backward=0.05, bubble=0.005, p2p=0.002), NO_STRAGGLERS,
                        {"stages": 2, "microbatches": 16}, DEFAULT_THRESHOLDS)
    assert [f["kind"] for f in findings] == ["compute-bound"]


# ------------------------------------------------------------------ levers only where they can move the number

MiB = 2 ** 20


def _starved(threads):
    """A CPU run whose compute kept a third of its threads busy, without more threads than cores."""
    return {**_run(forward=0.04, backward=0.05), "cpu": {"threads_per_rank": threads, "local_world_size": 2,
                                                         "cpu_cores": 2 * threads, "spread": {},
                                                         "utilisation": {"forward+backward": 0.3}}}


def test_cpu_oversubscribed_at_one_thread_does_not_advise_lowering_threads():
    lever = diagnose(_starved(1), NO_STRAGGLERS, {}, DEFAULT_THRESHOLDS)[0]["lever"]
    assert "--threads" not in lever and "(now 1)" not in lever
    assert "stop other jobs" in lever and "--cores-per-host" not in lever  # (not on the testbed)
    assert "lower --threads (now 2)" in diagnose(_starved(2), NO_STRAGGLERS, {}, DEFAULT_THRESHOLDS)[0]["lever"]


def test_no_bucket_cap_at_or_above_the_gradients_size():
    # lenet5: 0.24 MiB of gradients fit one bucket at any cap above it; 25 / 4 = 6.25 MiB would change nothing
    config = {"bucket_cap_mb": None, "batch_size": 64, "gradient_buckets": True, "gradient_bytes": int(0.24 * MiB)}
    lever = diagnose(_run(comm_exposed=0.05, forward=0.02, backward=0.03), NO_STRAGGLERS, config,
                     DEFAULT_THRESHOLDS)[0]["lever"]
    assert "6.25" not in lever
    assert "--bucket-cap-mb 0.06 " in lever  # about four buckets of its 0.24 MiB
    big = diagnose(_run(comm_exposed=0.05, forward=0.02, backward=0.03), NO_STRAGGLERS,
                   {**config, "gradient_bytes": 100 * MiB}, DEFAULT_THRESHOLDS)[0]["lever"]
    assert "--bucket-cap-mb 6.25" in big
    unknown = diagnose(_run(comm_exposed=0.05, forward=0.02, backward=0.03), NO_STRAGGLERS,
                       {"bucket_cap_mb": None, "batch_size": 64, "gradient_buckets": True},
                       DEFAULT_THRESHOLDS)[0]["lever"]
    assert "--bucket-cap-mb" not in unknown  # the gradients' size not known: no cap can be shown to help


def test_buckets_and_compression_only_for_strategies_they_apply_to():
    # the run records whether DDP's buckets carry its gradients and whether --compress goes with its strategy
    comm = _run(comm_exposed=0.05, forward=0.02, backward=0.03)
    fsdp = diagnose(comm, NO_STRAGGLERS, {"bucket_cap_mb": None, "batch_size": 64,
                                          "gradient_bytes": 100 * MiB, "gradient_buckets": False,
                                          "compressible": False}, DEFAULT_THRESHOLDS)[0]["lever"]
    assert "--bucket-cap-mb" not in fsdp and "bf16" not in fsdp  # FSDP: no DDP buckets, no --compress
    ring = diagnose({**comm, "overlap_ratio": 0.8}, NO_STRAGGLERS, {"batch_size": 64,
                                                                    "compressible": False},
                    DEFAULT_THRESHOLDS)[0]["lever"]
    assert "bf16" not in ring and "--batch-size 128" in ring
    plain = {"batch_size": 64, "compressible": True}
    assert "--compress bf16" in diagnose({**comm, "overlap_ratio": 0.8}, NO_STRAGGLERS, plain,
                                         DEFAULT_THRESHOLDS)[0]["lever"]
    done = diagnose({**comm, "overlap_ratio": 0.8}, NO_STRAGGLERS, {**plain, "compress": "topk:0.01"},
                    DEFAULT_THRESHOLDS)[0]["lever"]
    assert "bf16" not in done  # compressed already


def test_more_parameter_servers_only_while_workers_remain():
    comm = _run(comm_exposed=0.05, forward=0.02, backward=0.03)
    full = diagnose(comm, NO_STRAGGLERS, {"exchange_settings": ["ps_servers"], "ps_servers": 1, "nproc": 2,
                                          "batch_size": 8},
                    DEFAULT_THRESHOLDS)[0]["lever"]
    assert "--ps-servers" not in full  # 2 processes: 1 server, 1 worker, none to spare
    room = diagnose(comm, NO_STRAGGLERS, {"exchange_settings": ["ps_servers"], "ps_servers": 1, "nproc": 4,
                                          "batch_size": 8},
                    DEFAULT_THRESHOLDS)[0]["lever"]
    assert "--ps-servers 2" in room
    assert "--ps-push" not in room  # ps-sync's workers push every step together
    pushes = diagnose(comm, NO_STRAGGLERS, {"exchange_settings": ["ps_servers", "ps_push"], "ps_servers": 1,
                                            "nproc": 4, "batch_size": 8, "ps_push": 2}, DEFAULT_THRESHOLDS)
    assert "--ps-push 4" in pushes[0]["lever"]


def test_workers_only_while_each_rank_has_cores_for_them():
    data = _run(data_wait=0.031, forward=0.03, backward=0.039)
    full = diagnose(data, NO_STRAGGLERS, {"workers": 2, "cpu_cores": 4, "local_world_size": 2},
                    DEFAULT_THRESHOLDS)[0]["lever"]
    assert "--workers" not in full  # 2 workers per rank already, on 2 cores per rank
    assert "--workers 2" in diagnose(data, NO_STRAGGLERS, {"workers": 0, "cpu_cores": 2, "local_world_size": 2},
                                     DEFAULT_THRESHOLDS)[0]["lever"]  # off the training process: always
    digits = diagnose(data, NO_STRAGGLERS, {"workers": 0, "dataset": "digits"}, DEFAULT_THRESHOLDS)[0]["lever"]
    assert "pre-decoded" not in digits  # in memory already


def test_persistent_workers_only_when_they_are_not_yet():
    step = _run(data_wait=0.0, forward=0.04, backward=0.05)
    run = {**step, "epoch_start": {"wait_mean_s": 0.6, "steps_per_epoch": 12}}
    lever = diagnose(run, NO_STRAGGLERS, {"workers": 2, "persistent_workers": True}, DEFAULT_THRESHOLDS)[0]["lever"]
    assert "--persistent-workers" not in lever


def test_tiles_exchanging_their_borders_are_named_with_their_levers():
    from scaletrain.analysis.diagnosis import tiles_bound

    phases = {"data_wait": 0.0, "forward": 0.05, "backward": 0.08, "comm_exposed": 0.0, "optimizer": 0.01,
              "halo": 0.04, "gather": 0.01, "other": 0.01}
    found = tiles_bound(phases, 0.2, {"spatial": 4, "batch_size": 8}, {"diag_comm": 0.15})
    assert found["kind"] == "tiles-bound" and found["share"] == pytest.approx(0.25)
    assert "40.0 ms halo exchange" in found["message"] and "--spatial 2" in found["lever"]
    assert tiles_bound({**phases, "halo": 0.01, "gather": 0.0}, 0.2, {}, {"diag_comm": 0.15}) is None
    assert tiles_bound({k: v for k, v in phases.items() if k not in ("halo", "gather")}, 0.2, {},
                       {"diag_comm": 0.15}) is None
