"""The transformers Trainer in one process (CPU, a one-layer model) on a
chute.DataLoader its get_train_dataloader override returns, stopped 5 steps
into epoch 1 (a checkpoint there) and resumed from it: with
ChuteStateCallback the resumed steps see the uninterrupted run's samples,
batch for batch; without it the Trainer's skip_first_batches rebuild (which
would replay epoch 0's order) is refused, naming the callback."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import chute
import numpy as np
import pytest
import torch

transformers: Any = pytest.importorskip("transformers")
pytest.importorskip("accelerate")
hf_trainer: Any = pytest.importorskip("chute.frameworks.hf_trainer")

from runs.trainer_parts import ChuteTrainer, StopAt  # noqa: E402

ROWS, BATCH = 96, 8
EPOCH_STEPS = ROWS // BATCH
STOP = EPOCH_STEPS + 5  # a checkpoint 5 steps into epoch 1


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.seen: list[list[int]] = []

    def forward(self, x: torch.Tensor, id: torch.Tensor) -> dict[str, torch.Tensor]:  # noqa: A002
        self.seen.append([int(i) for i in id.tolist()])
        return {"loss": self.layer(x).pow(2).mean()}


def train(
    out: Path,
    make_loader: Callable[[], Any],
    *,
    callback: bool,
    stop: int = 0,
    resume: str | None = None,
) -> list[list[int]]:
    args = transformers.TrainingArguments(
        output_dir=str(out),
        per_device_train_batch_size=BATCH,
        num_train_epochs=2,
        save_strategy="steps",
        save_steps=STOP,
        use_cpu=True,
        report_to=[],
        disable_tqdm=True,
        logging_steps=1000,
        seed=5,
    )
    callbacks = [hf_trainer.ChuteStateCallback()] if callback else []
    model = Model()
    trainer = ChuteTrainer(
        make_loader, model=model, args=args, callbacks=callbacks + ([StopAt(stop)] if stop else [])
    )
    trainer.train(resume_from_checkpoint=resume)
    return model.seen


@pytest.fixture(scope="module")
def loaders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Callable[[], Any]]:
    import webdataset

    data = tmp_path_factory.mktemp("trainer-one")
    x = np.random.default_rng(0).standard_normal((ROWS, 4)).astype(np.float32)
    shards = []
    for shard in range(4):
        shards.append(str(data / f"shard-{shard}.tar"))
        with webdataset.TarWriter(shards[-1]) as sink:
            for i in range(shard * ROWS // 4, (shard + 1) * ROWS // 4):
                sink.write({"__key__": f"s{i:04d}", "x.npy": x[i], "id.cls": i})
    arrays = chute.ArrayDataset(x=x, id=np.arange(ROWS))

    def stream() -> Any:
        ds = (
            chute.WebDataset(shards, shardshuffle=True, seed=3)
            .shuffle(20)
            .decode()
            .to_tuple("x.npy", "id.cls")
            .batched(BATCH)
            .with_length(EPOCH_STEPS, silent=True)
        )
        return chute.DataLoader(ds, batch_size=None)

    return {
        "shuffled": lambda: chute.DataLoader(arrays, batch_size=BATCH, shuffle=True),
        "seeded": lambda: chute.DataLoader(
            arrays, batch_size=BATCH, shuffle=True, generator=torch.Generator().manual_seed(3)
        ),
        "in_order": lambda: chute.DataLoader(arrays, batch_size=BATCH),
        "partitioned": lambda: chute.DataLoader(
            arrays, batch_size=BATCH, shuffle=True, distributed=True, seed=2
        ),
        "stream": stream,
    }


KINDS = ["shuffled", "seeded", "in_order", "partitioned", "stream"]


@pytest.mark.parametrize("kind", KINDS)
def test_resume_with_the_callback_is_the_uninterrupted_run(
    loaders: dict[str, Callable[[], Any]], kind: str, tmp_path: Path
) -> None:
    make = loaders[kind]
    full = train(tmp_path / "full", make, callback=True)
    assert len(full) == 2 * EPOCH_STEPS
    assert sorted(sum(full[EPOCH_STEPS:], [])) == list(range(ROWS))
    head = train(tmp_path / "ck", make, callback=True, stop=STOP)
    tail = train(
        tmp_path / "ck", make, callback=True, resume=str(tmp_path / "ck" / f"checkpoint-{STOP}")
    )
    assert head == full[:STOP] and tail == full[STOP:]


@pytest.mark.parametrize("kind", KINDS)
def test_resume_without_the_callback_is_refused_naming_it(
    loaders: dict[str, Callable[[], Any]], kind: str, tmp_path: Path
) -> None:
    make = loaders[kind]
    train(tmp_path / "ck", make, callback=False, stop=STOP)
    with pytest.raises(
        ValueError,
        match=r"skip_first_batches rebuilt .* Add chute\.frameworks\.hf_trainer\."
        r"ChuteStateCallback\(\)",
    ):
        train(
            tmp_path / "ck",
            make,
            callback=False,
            resume=str(tmp_path / "ck" / f"checkpoint-{STOP}"),
        )


def test_accelerates_own_skip_first_batches_is_left_to_run(
    loaders: dict[str, Callable[[], Any]],
) -> None:
    """Outside the Trainer the caller can tell the epoch before rebuilding;
    a seeded sampler's order then holds (one generator draw of torch's
    loader would shift a generator-driven shuffle: not used here)."""
    from accelerate import skip_first_batches

    def ids(loader: Any) -> list[list[int]]:
        return [[int(i) for i in batch["id"].tolist()] for batch in loader]

    whole = loaders["partitioned"]()
    whole.set_epoch(1)
    told = loaders["partitioned"]()
    told.set_epoch(1)
    assert ids(skip_first_batches(told, 3)) == ids(whole)[3:]
