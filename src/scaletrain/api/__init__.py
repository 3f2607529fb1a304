"""scaletrain from Python (docs/api.md): `train`, `study` and `predict` with the commands' settings as
keyword arguments, and the runs, studies and predictions they write read back as typed results.

    import scaletrain.api as st

    if __name__ == "__main__":  # a script's workers re-run its top level: keep launches under this guard
        run = st.train(model="resnet20", dataset="digits", nproc=2, epochs=4, out="runs/r20")
        print(run.top1, run.phases_mean_s)
"""

from scaletrain.distributed.env import quiet_torch_cpp_logs

quiet_torch_cpp_logs()  # before anything imports torch, as the command does

from scaletrain.api.launch import RunFailed, predict, study, train  # noqa: E402
from scaletrain.api.results import (Epoch, Finding, PredictedPoint, Prediction, RankStats, Run, Study,  # noqa: E402
                                    StudyPoint, load_prediction, load_run, load_study)
from scaletrain.errors import UserError  # noqa: E402

__all__ = ["Epoch", "Finding", "PredictedPoint", "Prediction", "RankStats", "Run", "RunFailed", "Study",
           "StudyPoint", "UserError", "load_prediction", "load_run", "load_study", "predict", "study", "train"]
