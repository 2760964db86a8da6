"""The one training loop (specdec/training/loop.py): schedule values, window sampler, fit."""
from __future__ import annotations

import itertools
import math
import os
import signal
import threading

import pytest
import torch

from specdec.training import FitRecord, cosine_schedule, fit, sample_windows


def test_cosine_schedule_warmup_peak_and_end():
    kw = {"total_steps": 100, "peak_lr": 2.0, "warmup_steps": 10, "min_lr_ratio": 0.1}
    assert cosine_schedule(0, **kw) == pytest.approx(2.0 / 10)  # first warm-up step
    assert cosine_schedule(4, **kw) == pytest.approx(2.0 * 5 / 10)
    assert cosine_schedule(9, **kw) == pytest.approx(2.0)  # last warm-up step reaches the peak
    assert cosine_schedule(10, **kw) == pytest.approx(2.0)  # decay starts at the peak
    assert cosine_schedule(55, **kw) == pytest.approx(2.0 * (0.1 + 0.9 * 0.5))  # half-way: the mean
    assert cosine_schedule(100, **kw) == pytest.approx(0.2)  # one past the last step: the floor
    assert cosine_schedule(500, **kw) == pytest.approx(0.2)  # never below it
    decay = [cosine_schedule(s, **kw) for s in range(10, 101)]
    assert all(a >= b for a, b in itertools.pairwise(decay))
    # No warm-up: the first step runs at the peak.
    assert cosine_schedule(0, total_steps=10, peak_lr=1.0, warmup_steps=0) == pytest.approx(1.0)
    assert cosine_schedule(5, total_steps=10, peak_lr=1.0, warmup_steps=0, min_lr_ratio=0.0) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="warmup_steps and total_steps must be >= 0"):
        cosine_schedule(0, total_steps=10, peak_lr=1.0, warmup_steps=-1)


def test_sample_windows_shapes_contiguity_and_determinism():
    stream = torch.arange(1000, dtype=torch.long) * 3
    windows = sample_windows(stream, 6, 17, generator=torch.Generator().manual_seed(0))
    assert windows.shape == (6, 17) and windows.dtype == torch.long
    starts = windows[:, 0] // 3
    assert torch.equal(windows, stream[starts[:, None] + torch.arange(17)])  # consecutive tokens of the stream
    again = sample_windows(stream, 6, 17, generator=torch.Generator().manual_seed(0))
    other = sample_windows(stream, 6, 17, generator=torch.Generator().manual_seed(1))
    assert torch.equal(windows, again) and not torch.equal(windows, other)
    # Every start is reachable, the last one included; none runs past the end.
    g = torch.Generator().manual_seed(2)
    starts = torch.cat([sample_windows(torch.arange(10), 50, 8, generator=g)[:, 0] for _ in range(10)])
    assert set(starts.tolist()) == {0, 1, 2}
    assert torch.equal(sample_windows(torch.arange(5), 2, 5, generator=g), torch.arange(5).expand(2, 5))
    with pytest.raises(ValueError, match="fewer than one window"):
        sample_windows(torch.arange(4), 1, 5, generator=g)
    with pytest.raises(ValueError, match="1-D token stream"):
        sample_windows(torch.zeros(2, 10, dtype=torch.long), 1, 3, generator=g)


def test_fit_lowers_a_toy_loss_and_follows_the_schedule():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 5, generator=g)
    y = x @ torch.tensor([1.0, -2.0, 0.5, 3.0, 0.0])
    layer = torch.nn.Linear(5, 1)
    with torch.no_grad():
        layer.weight.zero_()
        layer.bias.zero_()

    def loss_fn(step):
        err = (layer(x).squeeze(-1) - y) ** 2
        return err.mean(), {"max_err": err.max().detach(), "step_seen": float(step)}

    history = fit(layer.parameters(), loss_fn, steps=200, lr=0.1, warmup_steps=10, progress=False)
    assert len(history) == 200 and all(isinstance(r, FitRecord) for r in history)
    assert history[-1].loss < 0.01 * history[0].loss
    assert [r.step for r in history] == list(range(1, 201))
    assert [r.metrics["step_seen"] for r in history] == [float(s) for s in range(200)]
    assert all(isinstance(r.metrics["max_err"], float) and math.isfinite(r.metrics["max_err"]) for r in history)
    expected = [cosine_schedule(s, total_steps=200, peak_lr=0.1, warmup_steps=10) for s in range(200)]
    assert [r.lr for r in history] == pytest.approx(expected)


def test_fit_param_groups_weight_decay_and_lr_scale():
    decayed, kept, slow = (torch.nn.Parameter(torch.ones(3)) for _ in range(3))
    groups = [{"params": [decayed], "weight_decay": 0.5}, {"params": [kept], "weight_decay": 0.0},
              {"params": [slow], "weight_decay": 0.0, "lr_scale": 0.0}]
    # A zero loss: only decoupled weight decay moves a parameter.
    fit(groups, lambda s: ((decayed + kept + slow).sum() * 0.0, {}), steps=5, lr=0.1, progress=False)
    assert torch.all(decayed < 1.0) and torch.equal(kept.detach(), torch.ones(3))
    assert torch.equal(slow.detach(), torch.ones(3))
    with pytest.raises(ValueError, match="got no parameters"):
        fit([], lambda s: (torch.zeros(()), {}), steps=1, lr=0.1, progress=False)


def test_fit_checkpoints_every_k_and_at_the_end_once():
    w = torch.nn.Parameter(torch.tensor([2.0]))
    calls: list[int] = []
    fit([w], lambda s: ((w ** 2).sum(), {}), steps=10, lr=0.1, checkpoint_every=4, checkpoint_fn=calls.append,
        progress=False)
    assert calls == [4, 8, 10]
    calls.clear()
    fit([w], lambda s: ((w ** 2).sum(), {}), steps=8, lr=0.1, checkpoint_every=4, checkpoint_fn=calls.append,
        progress=False)
    assert calls == [4, 8]  # the end coincides with a periodic checkpoint: not written twice
    calls.clear()
    fit([w], lambda s: ((w ** 2).sum(), {}), steps=3, lr=0.1, checkpoint_fn=calls.append, progress=False)
    assert calls == [3]
    with pytest.raises(ValueError, match="needs a checkpoint_fn"):
        fit([w], lambda s: ((w ** 2).sum(), {}), steps=3, lr=0.1, checkpoint_every=2, progress=False)


def test_fit_time_budget_stops_early_and_says_so(capsys):
    w = torch.nn.Parameter(torch.tensor([2.0]))
    calls: list[int] = []
    history = fit([w], lambda s: ((w ** 2).sum(), {}), steps=50, lr=0.1, time_budget=0.0,
                  checkpoint_fn=calls.append, progress=True, desc="toy")
    assert history == [] and calls == [] and torch.equal(w.detach(), torch.tensor([2.0]))
    assert "stopped: time budget" in capsys.readouterr().err
    # A budget that is not spent changes nothing.
    w2 = torch.nn.Parameter(torch.tensor([2.0]))
    history = fit([w2], lambda s: ((w2 ** 2).sum(), {}), steps=20, lr=0.1, time_budget=600.0, progress=False)
    assert len(history) == 20 and history[-1].loss < history[0].loss


def test_a_run_cut_by_its_time_budget_still_decays_to_the_floor():
    import time as _time

    w = torch.nn.Parameter(torch.tensor([2.0]))

    def slow(step):
        _time.sleep(0.02)
        return (w ** 2).sum(), {}

    history = fit([w], slow, steps=10_000, lr=0.1, warmup_steps=2, time_budget=0.5, progress=False)
    assert 5 < len(history) < 10_000
    rates = [r.lr for r in history]
    assert rates[1] == pytest.approx(0.1)                       # warm-up counts steps
    assert all(a >= b for a, b in zip(rates[2:], rates[3:]))    # then the decay only goes down
    assert rates[-1] < 0.1 * 0.35                               # and is near its floor (0.01) when time runs out
    # by steps alone the last rate would still be the peak's
    assert cosine_schedule(len(history), total_steps=10_000, peak_lr=0.1, warmup_steps=2) > 0.099


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="signal handlers: main thread")
def test_a_sigterm_ends_training_after_the_current_step_and_the_checkpoint_still_runs(capsys, monkeypatch):
    # e.g. `timeout` running out: the head trained so far is saved instead of lost
    from specdec.training import loop

    monkeypatch.setitem(loop._TERMINATED, "signal", None)  # the sticky flag is this test's alone
    w = torch.nn.Parameter(torch.tensor([3.0]))
    saved = []

    def loss_fn(step):
        if step == 3:
            os.kill(os.getpid(), signal.SIGTERM)  # arrives while step 3 runs
        return (w ** 2).sum(), {}

    before = signal.getsignal(signal.SIGTERM)
    history = fit([w], loss_fn, steps=50, lr=0.1, checkpoint_fn=saved.append)
    assert [r.step for r in history] == [1, 2, 3, 4]  # step 3 (the fourth) finished, no fifth began
    assert saved == [4]
    assert signal.getsignal(signal.SIGTERM) is before  # the process's handler is back
    assert "stopped: SIGTERM after 4 steps" in capsys.readouterr().err
    # a later training of the same process (a script's next head) takes no step instead of outliving the timeout
    v = torch.nn.Parameter(torch.tensor([1.0]))
    later = fit([v], lambda s: ((v ** 2).sum(), {}), steps=5, lr=0.1, checkpoint_fn=saved.append, progress=False)
    assert later == [] and saved == [4]
