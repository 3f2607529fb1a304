"""The levers a diagnosis suggests, each only where the run's facts say it can move the number (pure).

A lever the facts cannot vouch for (a key absent from the config) is left out rather than guessed.

  lever                        suggested when
  --workers N                  input-bound, and loading can gain processes: workers unknown (then "add
                               loader workers"), 0 (loading leaves the training process: N = 2), or fewer
                               per rank than each rank's cores (cpu_cores / local_world_size; N = twice, at
                               most those cores; no limit when the cores are unknown, e.g. on GPU)
  images stored pre-decoded    input-bound on an image folder (digits and synthetic are in memory already)
  --persistent-workers         the epoch start waits, with workers that are not persistent yet; persistent
                               ones: fewer --workers start sooner
  --bucket-cap-mb C            communication-bound with overlap < 50%, DDP's buckets carry the gradients
                               (gradient_buckets), the cap is not auto, and C is below the gradients'
                               size (gradient_bytes): C = cap / 4 (unset: DDP's 25), or a quarter of the
                               gradients when cap / 4 would still hold them all
  --compress bf16              communication-bound, the strategy takes compression (compressible) and
                               none is set (--precision bf16 sends the same fp32 gradients)
  --ps-servers S               communication-bound, ps_servers among the strategy's exchange_settings (a
                               parameter server), and a server more still leaves a worker:
                               S = min(2 x servers, processes - 1)
  --ps-push 2P                 communication-bound, ps_push among the exchange_settings (ps-async)
  --batch-size 2B              communication- or compute-bound: more compute per exchange
  --microbatches 2M            pipeline-bound, and 2M divides --batch-size (when it is known)
  fewer stages                 pipeline-bound with more than 2 stages
  --split auto                 pipeline-bound above 1.5 x theory's bubble, with another split
  --nproc C --threads 1        cpu-oversubscribed, more ranks than cores
  --threads N                  cpu-oversubscribed, ranks x threads > cores: N = cores / ranks
  lower --threads              cpu-oversubscribed by CPU time or spread, with more than 1 thread per rank
  --cores-per-host, fewer hosts   cpu-oversubscribed on the testbed (testbed: SCALETRAIN_CORES set)
  --precision bf16             compute-bound, fp32 on CUDA
"""

from __future__ import annotations

from typing import Any

DDP_DEFAULT_CAP_MB = 25.0
MiB = 2 ** 20


def _join(levers: list[str | None]) -> str:
    """The levers that apply (None: one that does not), as one line."""
    return "; or ".join(lever for lever in levers if lever)


def more_workers(config: dict[str, Any]) -> int | None:
    """--workers worth trying, or None when each rank's loader processes already have all its cores."""
    workers = config.get("workers")
    if not workers:
        return 2
    cores, ranks = config.get("cpu_cores"), config.get("local_world_size")
    room = cores // ranks if cores and ranks else None
    if room is not None and workers >= room:
        return None
    return min(2 * workers, room) if room else 2 * workers


def input_lever(config: dict[str, Any]) -> str:
    levers = []
    if "workers" not in config:
        levers.append("add data-loader workers (--workers)")
    elif more_workers(config) is not None:
        levers.append(f"try --workers {more_workers(config)} (more parallel decoding)")
    levers.append("a smaller --image-size")
    if str(config.get("dataset") or "").startswith("imagefolder"):
        levers.append("images stored pre-decoded")
    return _join(levers)


def epoch_start_lever(config: dict[str, Any]) -> str:
    workers = config.get("workers")
    if not workers:
        return "load the first batch sooner: fewer/smaller files per batch"
    if config.get("persistent_workers"):
        return ("the workers already persist between epochs, so this is their first start: fewer --workers "
                "start sooner, if the steady data wait allows")
    return "keep the workers alive between epochs: --persistent-workers"


def bucket_cap(config: dict[str, Any]) -> tuple[str, str] | None:
    """(--bucket-cap-mb value, why) for smaller buckets below the gradients' size, or None where the facts do
    not show one would split them more: no DDP buckets, `auto`, or the gradients' size not recorded."""
    grad = config.get("gradient_bytes")
    cap = config.get("bucket_cap_mb")
    if not config.get("gradient_buckets") or not grad or cap == "auto":
        return None
    grad_mb = grad / MiB
    smaller = (cap or DDP_DEFAULT_CAP_MB) / 4
    if smaller < grad_mb:
        return f"{smaller:g}", ""
    quarter = f"{grad_mb / 4:.2g}"
    return quarter, f" (about 4 buckets of the {grad_mb:.2g} MiB of gradients)"


def compress_lever(config: dict[str, Any]) -> str | None:
    if not config.get("compressible") or config.get("compress") not in (None, "", "none"):
        return None
    return "fewer bytes: --compress bf16 (or topk:RATIO, docs/strategies.md)"


def bigger_batch(config: dict[str, Any]) -> str:
    batch = config.get("batch_size")
    return f"--batch-size {2 * batch}" if batch else "a larger batch per rank"


def comm_lever(config: dict[str, Any], overlap: float | None) -> str:
    more = f"more compute per exchange: {bigger_batch(config)}"
    settings = config.get("exchange_settings") or ()
    low = overlap is not None and overlap < 0.5
    cap = bucket_cap(config) if low else None
    if low and config.get("gradient_buckets") and config.get("bucket_cap_mb") == "auto":
        head = ["--bucket-cap-mb auto already chose the size the model predicts hides the most: " + more]
    elif cap is not None:
        head = [f"start reducing earlier with smaller buckets: try --bucket-cap-mb {cap[0]}{cap[1]}", more]
    else:
        head = [more]
    if "ps_servers" in settings:  # the exchange follows backward whole; the servers' links are the limit
        servers = config.get("ps_servers") or 1
        processes = (config.get("nproc") or 0) * (config.get("nnodes") or 1)
        spread = min(2 * servers, processes - 1)
        if spread > servers:
            head.insert(0, f"spread the parameters over more servers: try --ps-servers {spread}")
    if "ps_push" in settings:
        head.append(f"push less often: --ps-push {2 * (config.get('ps_push') or 1)}")
    return _join([*head, compress_lever(config)])


def pipeline_lever(config: dict[str, Any], k: int, m: int, theory: float, measured: float) -> str:
    batch = config.get("batch_size")
    more_micro = (f"--microbatches {2 * m}" if not batch or batch % (2 * m) == 0 else None)
    if measured > 1.5 * theory:
        head = (f"the bubble is {measured / theory:.1f}x theory's: balance the stages with --split auto "
                f"(`scaletrain split` shows each stage's time)" if config.get("split") != "auto" else
                f"the bubble is {measured / theory:.1f}x theory's although the split is balanced as predicted: "
                f"check the stage times in the report against `scaletrain split`")
        return _join([head, more_micro])
    levers = []
    if more_micro is not None:
        after = (k - 1) / (2 * m + k - 1)
        levers.append(f"{more_micro} (theory's bubble falls from {theory:.0%} to {after:.0%}"
                      + ("; the batch must divide)" if not batch else ")"))
    if k > 2:
        levers.append("fewer stages")
    levers.append(f"a larger batch ({bigger_batch(config)})")
    return _join(levers)


def tiles_lever(config: dict[str, Any]) -> str:
    """Fewer, larger tiles exchange less border per pixel; a larger batch more compute per exchange."""
    tiles = config.get("spatial")
    fewer = f"fewer tiles (--spatial {tiles // 2})" if isinstance(tiles, int) and tiles >= 4 else None
    return _join([fewer, "an earlier --spatial-until (less of the model on tiles, when its memory allows)",
                  f"a larger batch ({bigger_batch(config)})"])


def straggler_lever(rank: int, config: dict[str, Any]) -> str:
    loaders = ", its data-loader workers" if config.get("workers") != 0 else ""
    return (f"look at what slows rank {rank}: other load on its host or device{loaders}, uneven data, "
            "thermal limits")


def cpu_lever(evidence: list[str], threads: int | None, ranks: int | None, cores: int | None,
              config: dict[str, Any]) -> str:
    testbed = ["on the testbed, fewer hosts or --cores-per-host"] if config.get("testbed") else []
    if "threads" in evidence and ranks > cores:
        return _join([f"at most {cores} ranks per node on {cores} core{'s' * (cores != 1)}: --nproc {cores} "
                      "--threads 1", *testbed])
    if "threads" in evidence:
        fit = cores // ranks
        return _join([f"--threads {fit} so that ranks x threads <= cores ({ranks} x {fit} <= {cores})", *testbed])
    levers = ["give each process its own cores: stop other jobs on these cores", *testbed]
    if threads and threads > 1:
        levers.append(f"lower --threads (now {threads}) so that all ranks' threads fit the free cores")
    return _join(levers)


def compute_lever(config: dict[str, Any], comm_share: float) -> str:
    exposed = f"exposed communication is only {comm_share:.0%} of a step"
    if config.get("precision", "fp32") == "fp32" and config.get("device") == "cuda":
        return f"faster arithmetic: --precision bf16 on hardware with bf16 units; or more devices ({exposed})"
    return (f"more devices ({exposed}, so more ranks should scale), a larger --batch-size for better "
            "utilisation, or a smaller model")
