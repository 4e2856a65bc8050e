import pytest
import torch

from state_reduction.checkpoints import RunStateError
from state_reduction.ssm.train import TrainConfig, load_s5, train


def _cfg(**kw) -> TrainConfig:
    base = dict(data={"n_train": 64, "n_val": 16, "n_test": 16, "max_len": 24, "max_depth": 2},
                model={"d_model": 8, "d_state": 4, "n_layers": 1}, steps=4, batch_size=8, warmup_steps=1,
                checkpoint_every=2, eval_every=4)
    return TrainConfig(**{**base, **kw})


def test_a_finished_run_resumes_to_the_same_model_and_another_config_is_refused(tmp_path):
    torch.set_num_threads(1)
    record = train(_cfg(), tmp_path / "a", tmp_path / "run", log=lambda _: None)
    again = train(_cfg(), tmp_path / "b", tmp_path / "run", log=lambda _: None)  # resumes at the last step
    assert again["curve"] == record["curve"]
    for (n, p), (_, q) in zip(load_s5(tmp_path / "a").state_dict().items(), load_s5(tmp_path / "b").state_dict().items()):
        assert torch.equal(p, q), n
    with pytest.raises(RunStateError, match="S5 training run state .* belongs to another config"):
        train(_cfg(lr=1e-2), tmp_path / "c", tmp_path / "run", log=lambda _: None)


def test_a_damaged_run_state_is_a_one_line_error_naming_the_file(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "state.pt").write_bytes(b"not a torch file")
    with pytest.raises(RunStateError, match=r"state\.pt is damaged") as e:
        train(_cfg(), tmp_path / "a", tmp_path / "run", log=lambda _: None)
    assert "delete" in str(e.value) and "\n" not in e.value.one_line()
