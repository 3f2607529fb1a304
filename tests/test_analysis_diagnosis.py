"""Diagnosis findings: thresholds, levers with numbers, ordering."""

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
                        {"bucket_cap_mb": 25.0, "batch_size": 64}, DEFAULT_THRESHOLDS)
    assert [f["kind"] for f in findings] == ["communication-bound"]
    assert "--bucket-cap-mb 6.25" in findings[0]["lever"] and "--batch-size 128" in findings[0]["lever"]


def test_straggler_names_the_rank():
    stragglers = {"repeated": [{"rank": 3, "share": 0.9, "lag_mean_s": 0.02}]}
    findings = diagnose(_run(forward=0.04, backward=0.06), stragglers, {}, DEFAULT_THRESHOLDS)
    assert findings[0]["kind"] == "straggler" and findings[0]["rank"] == 3
    assert "rank 3" in findings[0]["message"] and "90%" in findings[0]["message"]


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
