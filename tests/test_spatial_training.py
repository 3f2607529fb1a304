"""`--strategy spatial` (comm/spatial/strategy.py): tiles of each image on 2 or 4 ranks, the front exchanging halos
and taking BatchNorm's statistics over the whole image, train the same model as one process with the same global
batch (float64: exact on any CPU), and 2 replicas of 2 tiles follow 2 data-parallel ranks; tiles x pipeline stages
(x replicas) follow the pipeline on whole images and resume exactly; what cannot be tiled is refused."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import EXACT, FP64, assert_same_weights, losses, summary, weights
from scaletrain.cli import main

# ResNet-20 has BatchNorm after every convolution and residual additions: its front up to layer1 (its
# option-A shortcuts from layer2 on have no tiled version, so auto ends the front there)
RESNET = ["--model", "resnet20", "--dataset", "digits", "--image-size", "8", "--epochs", "1", "--lr", "0.1",
          "--no-augment", "--seed", "3", "--tensorboard", "off", *FP64]


@pytest.fixture(scope="module")
def one(tmp_path_factory, ranks):
    import multirank

    run = tmp_path_factory.mktemp("spatial") / "one"
    multirank.train(ranks, *RESNET, "--nproc", "1", "--batch-size", "64", "--out", str(run), timeout=300)
    return run


@pytest.mark.equivalence
def test_two_tiles_follow_one_process_with_the_same_global_batch(one, tmp_path, ranks):
    import multirank

    run = tmp_path / "tiles"
    multirank.train(ranks, *RESNET, "--strategy", "spatial", "--spatial", "2", "--nproc", "2", "--batch-size", "64",
                    "--out", str(run), timeout=300)
    s1, s2 = summary(one), summary(run)
    assert s2["world_size"] == 2 and s1["global_batch"] == s2["global_batch"] == 64
    tiles = s2["spatial"]
    assert {k: tiles[k] for k in ("tiles", "grid", "replicas", "until", "tiled_layers")} == {
        "tiles": 2, "grid": [1, 2], "replicas": 1, "until": "layer1", "tiled_layers": 14}
    # the halos sent per step, counted, against the geometry's bytes (7 convs of 3x3: a column each way)
    assert tiles["halo_bytes_per_step"] == tiles["halo_bytes_per_step_theory"] > 0
    assert s2["replicas_identical"] is True  # both tiles stepped the same gradients
    l1, l2 = losses(one), losses(run)
    assert len(l1) == len(l2) and l2 == pytest.approx(l1, rel=EXACT["rtol"])
    assert l1[-1] < l1[0] - 0.5, "training did not learn, so the comparison proves little"
    assert_same_weights(one, run)  # BatchNorm's running statistics included: the whole image's
    assert s2["top1"] == s1["top1"]
    # the halo exchange and the gather are phases of their own, and the phases still add up to each step
    records = [json.loads(line) for line in (run / "metrics-rank0.jsonl").read_text().splitlines()]
    assert all(r["phases_s"]["halo"] > 0 and r["phases_s"]["gather"] > 0 for r in records)
    assert all(sum(r["phases_s"].values()) == pytest.approx(r["step_time_s"], abs=1e-5) for r in records)
    assert "halo" in s2["phases_mean_s"]


# ResNet-18's ImageNet stem (7x7/2 convolution, BatchNorm, ReLU, 3x3/2 max pooling) runs fused on tiles
STEM = ["--model", "resnet18", "--stem", "imagenet", "--dataset", "synthetic", "--synthetic-samples", "12",
        "--image-size", "64", "--batch-size", "4", "--epochs", "1", "--lr", "0.05", "--no-augment", "--seed", "5",
        "--tensorboard", "off", *FP64]


@pytest.mark.slow  # ResNet-18 in float64, 3 times
@pytest.mark.equivalence
def test_a_fused_stem_trains_as_one_process_does_with_and_without_checkpointing(tmp_path, ranks):
    import multirank

    one = tmp_path / "one"
    multirank.train(ranks, *STEM, "--nproc", "1", "--out", str(one), timeout=300)
    for extra in ([], ["--checkpoint-activations", "blocks"]):
        run = tmp_path / ("tiles" + "-".join(extra))
        multirank.train(ranks, *STEM, *extra, "--strategy", "spatial", "--spatial", "2", "--nproc", "2",
                        "--spatial-until", "layer2", "--out", str(run), timeout=300)
        s = summary(run)
        assert s["spatial"]["fused_stems"] == [["stem.0", "stem.1", "stem.2", "stem.3"]]
        # the stem's pooling sends its forward halos again in its own backward; its convolution, on the image,
        # no gradient; checkpointing leaves the stem to itself and recomputes layer1 and layer2's blocks
        assert s["spatial"]["halo_bytes_per_step"] == s["spatial"]["halo_bytes_per_step_theory"] > 0
        if extra:
            assert "stem" not in s["checkpointed_blocks"] and "layer1.0" in s["checkpointed_blocks"]
        assert losses(run) == pytest.approx(losses(one), rel=EXACT["rtol"])
        assert_same_weights(one, run)


@pytest.mark.slow  # 4 ranks on 2 cores
@pytest.mark.equivalence
def test_four_tiles_follow_one_process(one, tmp_path, ranks):
    import multirank

    run = tmp_path / "tiles"
    multirank.train(ranks, *RESNET, "--strategy", "spatial", "--spatial", "4", "--nproc", "4", "--batch-size", "64",
                    "--out", str(run), timeout=600)
    tiles = summary(run)["spatial"]
    assert tiles["grid"] == [2, 2] and summary(run)["global_batch"] == 64
    assert tiles["halo_bytes_per_step"] == tiles["halo_bytes_per_step_theory"] > 0  # rows, then padded columns
    assert losses(run) == pytest.approx(losses(one), rel=EXACT["rtol"])
    assert_same_weights(one, run)


@pytest.mark.slow  # 4 ranks on 2 cores
@pytest.mark.equivalence
def test_two_replicas_of_two_tiles_follow_two_data_parallel_ranks(tmp_path, ranks):
    # replicas take BatchNorm's statistics over their own batch, as DDP's ranks do: the reference is DDP
    import multirank

    ddp, run = tmp_path / "ddp", tmp_path / "tiles"
    multirank.train(ranks, *RESNET, "--nproc", "2", "--batch-size", "32", "--out", str(ddp), timeout=600)
    multirank.train(ranks, *RESNET, "--strategy", "spatial", "--spatial", "2", "--nproc", "4", "--batch-size", "32",
                    "--out", str(run), timeout=600)
    s = summary(run)
    assert s["spatial"]["replicas"] == 2 and s["global_batch"] == summary(ddp)["global_batch"] == 64
    assert losses(run) == pytest.approx(losses(ddp), rel=EXACT["rtol"])  # rank 0: the first replica's batches
    # sums over tiles, replicas and DDP's buckets in other orders: float64 roundoff of ~1e-11, which an element
    # near zero shows against a relative tolerance alone
    assert_same_weights(ddp, run, rtol=1e-9, atol=1e-9)


# spatial x pipeline: the tiles' pipelines (comm/spatial/pipeline.py) against the pipeline on whole images, which
# tests/test_pipeline.py holds to one process's micro-batch loop (BatchNorm per micro-batch)
STAGES = ["--microbatches", "2", "--split", "uniform", "--batch-size", "64"]


@pytest.fixture(scope="module")
def piped(tmp_path_factory, ranks):
    import multirank

    run = tmp_path_factory.mktemp("spatial-pipeline") / "pipeline"
    multirank.train(ranks, *RESNET, "--strategy", "pipeline", "--nproc", "2", *STAGES, "--out", str(run), timeout=300)
    return run


@pytest.mark.slow  # 4 ranks on 2 cores
@pytest.mark.equivalence
def test_two_tiles_x_two_stages_follow_the_pipeline_on_whole_images(piped, tmp_path, ranks):
    import multirank

    run = tmp_path / "tiles"
    multirank.train(ranks, *RESNET, "--strategy", "spatial", "--spatial", "2", "--stages", "2", "--nproc", "4",
                    *STAGES, "--out", str(run), timeout=600)
    s = summary(run)
    assert s["world_size"] == 4 and s["global_batch"] == summary(piped)["global_batch"] == 64
    assert s["pipeline"]["bounds"] == summary(piped)["pipeline"]["bounds"] == [[0, 6], [6, 11]]
    tiles = s["spatial"]
    assert (tiles["tiles"], tiles["stages"], tiles["until"]) == (2, 2, "layer1")
    assert tiles["halo_bytes_per_step"] == tiles["halo_bytes_per_step_theory"] > 0
    assert losses(run) == pytest.approx(losses(piped), rel=EXACT["rtol"])
    assert_same_weights(piped, run)  # BatchNorm's running statistics: each micro-batch's whole image
    assert s["top1"] == summary(piped)["top1"]
    records = [json.loads(line) for line in (run / "metrics-rank0.jsonl").read_text().splitlines()]
    assert all(r["phases_s"]["halo"] > 0 and r["phases_s"]["bubble"] >= 0 for r in records)
    assert all(sum(r["phases_s"].values()) == pytest.approx(r["step_time_s"], abs=1e-5) for r in records)


@pytest.mark.slow  # 4 ranks on 2 cores, twice
def test_tiles_x_stages_resume_exactly(tmp_path, ranks):
    import multirank

    argv = [*RESNET, "--strategy", "spatial", "--spatial", "2", "--stages", "2", "--nproc", "4", *STAGES,
            "--epochs", "2"]
    straight, broken = tmp_path / "straight", tmp_path / "broken"
    multirank.train(ranks, *argv, "--out", str(straight), timeout=600)
    multirank.train(ranks, *argv, "--stop-after", "1", "--out", str(broken), timeout=600)
    multirank.train(ranks, "--resume", "--out", str(broken), timeout=600)
    a, b = weights(straight), weights(broken)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert losses(broken) == losses(straight)
    assert summary(broken)["status"] == "completed"


@pytest.mark.slow  # 8 ranks on 2 cores
@pytest.mark.equivalence
def test_two_replicas_of_tiles_x_stages_follow_two_pipeline_replicas(tmp_path, ranks):
    import multirank

    piped2, run = tmp_path / "pipelines", tmp_path / "tiles"
    small = [*STAGES[:-1], "32"]
    multirank.train(ranks, *RESNET, "--strategy", "pipeline", "--nproc", "2x2", *small, "--out", str(piped2),
                    timeout=600)
    multirank.train(ranks, *RESNET, "--strategy", "spatial", "--spatial", "2", "--stages", "2", "--nproc", "8",
                    *small, "--out", str(run), timeout=900)
    s = summary(run)
    assert s["spatial"]["replicas"] == 2 and s["global_batch"] == summary(piped2)["global_batch"] == 64
    assert losses(run) == pytest.approx(losses(piped2), rel=EXACT["rtol"])
    assert_same_weights(piped2, run, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("extra, words", [
    (["--spatial-until", "layer2"], "getitem in layer2.0.shortcut (PadShortcut) may mix pixels"),
    (["--spatial-until", "nowhere"], "--spatial-until nowhere: the model has no layer of that name"),
    (["--spatial", "3", "--nproc", "4"], "needs a multiple of 3 processes"),
    (["--image-size", "7"], "does not divide into 2 tiles"),
    (["--strategy", "allreduce", "--spatial", "4"], "--spatial"),
    (["--stages", "2"], "with --spatial 2 x --stages 2 needs a multiple of 4 processes"),
    (["--stages", "2", "--nproc", "4", "--microbatches", "1"], "--microbatches 1 is fewer than the 2 stages"),
    (["--stages", "2", "--nproc", "4", "--microbatches", "2", "--spatial-until", "stem.0"],
     "--spatial-until stem.0 ends inside block stem: with --stages the tiles are gathered between two blocks; "
     "end the front with one of stem, layer1"),
])
def test_what_cannot_be_tiled_is_refused_in_one_line(tmp_path, capsys, extra, words):
    argv = ["train", *RESNET, "--strategy", "spatial", "--spatial", "2", "--nproc", "2", "--batch-size", "64",
            "--out", str(tmp_path / "x"), *extra]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and err.count("\n") == 0, err


def test_predict_prices_the_tiles_with_the_halo_bytes_the_run_counts(tmp_path, capsys):
    """predict's spatial point (a calibration's op times) sends the halo bytes the geometry gives (what the training
    run counts: test_two_tiles_... above, in fp64) and runs the front's ops on half the pixels; tiles in pipeline
    stages send the same bytes, micro-batch by micro-batch."""
    from predict_fixtures import fake_calibration
    from scaletrain.predict import calibration

    cal = calibration.save(fake_calibration(), tmp_path / "cal.json")
    common = ["predict", "--calibration", str(cal), "--model", "resnet20", "--dataset", "digits", "--image-size", "8",
              "--batch-size", "64", "--nproc", "2"]
    assert main([*common, "--strategy", "spatial,allreduce", "--out", str(tmp_path / "p")]) == 0
    tiles, ddp = json.loads((tmp_path / "p" / "prediction.json").read_text())["points"]
    # a column each way per 3x3 conv, forward and back (six of 16 channels; the stem's 1 channel of digits forward
    # only: the image takes no gradient), 8 rows, 64 samples, 4 bytes
    assert tiles["comm"]["halo_bytes_per_step"] == (1 + 6 * 16 * 2) * 8 * 64 * 4
    assert tiles["phases_s"]["halo"] > 0 and tiles["phases_s"]["gather"] > 0
    assert tiles["samples_per_s"] == pytest.approx(64 / tiles["step_time_s"])  # one replica: 2 tiles of each image
    assert tiles["phases_s"]["forward"] < ddp["phases_s"]["forward"]
    assert tiles["memory_bytes"]["activations"] < ddp["memory_bytes"]["activations"]
    assert main([*common, "--nproc", "4", "--strategy", "spatial,pipeline", "--stages", "2", "--microbatches", "2",
                 "--out", str(tmp_path / "q")]) == 0
    staged, piped = json.loads((tmp_path / "q" / "prediction.json").read_text())["points"]
    assert staged["comm"]["halo_bytes_per_step"] == tiles["comm"]["halo_bytes_per_step"]
    assert staged["phases_s"]["halo"] > 0 and staged["phases_s"]["gather"] > 0 and staged["phases_s"]["bubble"] > 0
    assert staged["pipeline"]["until"] == "layer1" and staged["memory_bytes"]["activations"] < \
        piped["memory_bytes"]["activations"]


def test_predict_prices_each_halo_exchange_at_the_calibrations_halo_fit(tmp_path, capsys):
    """A halo exchange between ranks that compute between exchanges costs commbench's `halo` fit (their skew
    included), not the idle point-to-point latency; a calibration without that fit is priced at the latter and
    says so."""
    from predict_fixtures import fake_calibration
    from scaletrain.predict import calibration

    def halo_phase(name: str, fits: dict) -> tuple[dict, list[str]]:
        cal = fake_calibration()
        cal["network"]["fits"] = fits
        path = calibration.save(cal, tmp_path / f"{name}.json")
        assert main(["predict", "--calibration", str(path), "--model", "resnet20", "--dataset", "digits",
                     "--image-size", "8", "--batch-size", "64", "--nproc", "2", "--strategy", "spatial",
                     "--out", str(tmp_path / name)]) == 0
        capsys.readouterr()
        prediction = json.loads((tmp_path / name / "prediction.json").read_text())
        return prediction["points"][0], prediction["notes"]

    idle = {k: {"alpha_s": 1e-4, "beta_s_per_byte": 1e-9} for k in ("allreduce", "ring", "ps")}
    loaded, notes = halo_phase("halo", {**idle, "halo": {"alpha_s": 2e-3, "beta_s_per_byte": 3e-9}})
    sent = loaded["comm"]["halo_bytes_per_step"]
    # 13 exchanges: the stem's convolution forward only (on the image), six 3x3 convolutions forward and back
    assert loaded["phases_s"]["halo"] == pytest.approx(13 * 2e-3 + sent * 3e-9)
    assert not any("no halo fit" in n for n in notes)
    old, notes = halo_phase("old", idle)
    assert old["phases_s"]["halo"] == pytest.approx(13 * 1e-4 + sent * 1e-9)
    assert any("no halo fit" in n and "calibrate again" in n for n in notes)
    # each of the front's 7 BatchNorm layers (the stem's, six in layer1) waits as a halo exchange does, each way:
    # the halo fit's latency beyond the idle point-to-point's
    for phase in ("forward", "backward"):
        assert loaded["phases_s"][phase] - old["phases_s"][phase] == pytest.approx(7 * (2e-3 - 1e-4))


def test_tiles_in_pipeline_stages_pay_each_micro_batchs_exchanges_in_the_stage_that_holds_the_layer(tmp_path):
    """2 tiles x 2 stages, 4 micro-batches: the same 13 exchanges per micro-batch as the tiles alone make per batch,
    at the halo fit, over the stages (the halo phase is a mean over them, as every pipeline phase is), the bytes a
    quarter each time; the front's blocks priced on a tile, so the stages compute less than the pipeline on whole
    images."""
    from predict_fixtures import fake_calibration
    from scaletrain.predict import calibration

    cal = fake_calibration()
    cal["network"]["fits"] = {**{k: {"alpha_s": 1e-4, "beta_s_per_byte": 1e-9} for k in ("allreduce", "ring", "ps")},
                              "halo": {"alpha_s": 2e-3, "beta_s_per_byte": 3e-9}}
    path = calibration.save(cal, tmp_path / "cal.json")
    assert main(["predict", "--calibration", str(path), "--model", "resnet20", "--dataset", "digits", "--image-size",
                 "8", "--batch-size", "64", "--nproc", "4", "--strategy", "spatial,pipeline", "--stages", "2",
                 "--microbatches", "4", "--out", str(tmp_path / "p")]) == 0
    staged, piped = json.loads((tmp_path / "p" / "prediction.json").read_text())["points"]
    sent, k, m = staged["comm"]["halo_bytes_per_step"], 2, 4
    assert staged["phases_s"]["halo"] == pytest.approx(m / k * (13 * 2e-3 + sent / m * 3e-9))
    # the stem and layer1 on half the pixels: of the whole model's compute, more than half and less than all
    assert 0.5 < staged["pipeline"]["compute_share"] < 1 and piped["pipeline"].get("compute_share") is None
    assert staged["phases_s"]["gather"] > 0 and staged["pipeline"]["gather_after_block"] == 4


def test_predict_prices_the_fused_stems_recompute_and_the_flat_messages_copies(tmp_path, capsys, monkeypatch):
    """ResNet-18's ImageNet stem runs fused on the tiles (comm/spatial/stem.py): it keeps only its input, so its
    forward runs again in backward, on the tile; the front's gradients go as one flat message, copied in and
    out."""
    from predict_fixtures import NETWORK, fake_calibration
    from scaletrain.comm.spatial import front as front_module
    from scaletrain.config import build_config
    from scaletrain.perf import alphabeta
    from scaletrain.predict.points import predict_config
    from scaletrain.predict.predictor import Predictor

    p = Predictor(fake_calibration(), NETWORK)
    flags = {"model": "resnet18", "stem": "imagenet", "dataset": "synthetic", "image_size": 64, "batch_size": 4,
             "nproc": 2, "threads": 1}
    cfg = build_config({}, {**flags, "strategy": "spatial", "spatial": 2})
    fused = predict_config(p, cfg)
    whole = predict_config(p, build_config({}, {**flags, "strategy": "allreduce"}))
    monkeypatch.setattr(front_module, "_stems", lambda *a: ())  # as if the stem ran as four layers
    monkeypatch.setattr(front_module, "_kept", type(front_module._kept)())  # (the front planned again)
    four = predict_config(Predictor(fake_calibration(), NETWORK), cfg)  # (a new basis: a point is kept per basis)
    stem = {"stem_0", "stem_1", "stem_2", "stem_3"}
    share = sum(o["forward_s"] for o in fused["ops"] if o["name"] in stem) / sum(o["forward_s"] for o in fused["ops"])
    assert 0 < share < 1
    assert fused["phases_s"]["backward"] - four["phases_s"]["backward"] == \
        pytest.approx(whole["phases_s"]["forward"] * share / 2)  # the stem's forward, on a tile: again
    assert fused["phases_s"]["forward"] == four["phases_s"]["forward"]
    grads = fused["comm"]["bytes_per_step"] - fused["comm"]["halo_bytes_per_step"] \
        - 4 * 512 * 2 * 2 * 4 // 2  # less the halos and the gathered half of layer4's output (4 x 512 x 2 x 2)
    fit = NETWORK["intra"]["allreduce"]
    assert fused["phases_s"]["comm_exposed"] == pytest.approx(
        alphabeta.predict(fit["alpha_s"], fit["beta_s_per_byte"], 2, grads) + 2 * p.copy_s(grads, 1))
    assert p.copy_s(4 * 10**6, 1) > p.copy_s(4 * 10**4, 1) > 0


def test_the_flat_message_pays_its_fresh_pages_under_the_policy_the_run_takes():
    """The front's gradients (ResNet-18: 44.7 MB) go in one message made anew each step: above the allocator's mmap
    threshold its pages are fresh each time (distributed/pages.py), at the calibrated rate of the policy the run takes
    (steady; lean when a CPU run has a --memory-per-device budget); a calibration without the measure prices none."""
    from predict_fixtures import NETWORK, fake_calibration
    from scaletrain.config import build_config
    from scaletrain.predict.points import predict_config
    from scaletrain.predict.predictor import Predictor

    flags = {"model": "resnet18", "stem": "imagenet", "dataset": "synthetic", "image_size": 64, "batch_size": 4,
             "nproc": 2, "threads": 1, "strategy": "spatial", "spatial": 2}
    cal = fake_calibration()
    plain = Predictor(cal, NETWORK)
    paged = Predictor({**cal, "memory": {"fresh_pages": {"steady": {"seconds_per_byte": 3e-10},
                                                         "lean": {"seconds_per_byte": 1e-10}}}}, NETWORK)
    for extra, rate in (({}, 3e-10), ({"memory_per_device": "8GiB"}, 1e-10)):
        cfg = build_config({}, {**flags, **extra})
        before, after = predict_config(plain, cfg), predict_config(paged, cfg)
        grads = before["comm"]["bytes_per_step"] - before["comm"]["halo_bytes_per_step"] - 4 * 512 * 2 * 2 * 4 // 2
        assert grads > 32 * 2**20
        assert after["phases_s"]["comm_exposed"] - before["phases_s"]["comm_exposed"] == pytest.approx(rate * grads)
    assert paged.fresh_s(2**20 - 4, build_config({}, {"memory_per_device": "8GiB"})) == 0.0  # under lean's 1 MiB
    assert paged.fresh_s(2**20, build_config({}, {"memory_per_device": "8GiB"})) == pytest.approx(1e-10 * 2**20)
    assert paged.fresh_s(2**20, build_config({}, {})) == 0.0  # steady: the heap's memory, reused

