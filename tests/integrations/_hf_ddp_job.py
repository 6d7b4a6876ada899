"""A Hugging Face Trainer DDP job on CPU: 2 ranks (gloo) of a tiny BERT built from a
config, ``TraceCallback`` given to the trainer on rank 0 and added to it with
``add_callback`` on rank 1, rank 1 sleeping ``SLOW_S`` at the
start of every 4th step: ``python _hf_ddp_job.py TRACE_DIR TRUTH_DIR PORT``. Each rank
writes what it slept and its optimizer steps to ``TRUTH_DIR/truth-<rank>.json``."""

from __future__ import annotations

import json
import os
import sys
import time

STEPS, SLOW_S, SLOW_EVERY, SLOW_RANK = 16, 1.0, 4, 1


def run(rank: int, world: int, out: str, truth: str, port: str) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    import torch
    import transformers

    import dftrace
    from dftrace.transformers import TraceCallback

    torch.set_num_threads(1)  # two ranks on two cores: no oversubscription of intra-op threads
    dftrace.initialize(log_file=os.path.join(out, "run"))
    slept = [0.0]

    class Slow(transformers.TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            if rank == SLOW_RANK and state.global_step % SLOW_EVERY == 1:
                t0 = time.perf_counter()
                time.sleep(SLOW_S)
                slept[0] += time.perf_counter() - t0

    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=32, max_position_embeddings=16, num_labels=2)
    g = torch.Generator().manual_seed(0)
    data = [{"input_ids": torch.randint(0, 50, (8,), generator=g), "attention_mask": torch.ones(8, dtype=torch.long),
             "labels": i % 2} for i in range(STEPS * 2 * world)]
    args = transformers.TrainingArguments(
        output_dir=os.path.join(truth, f"out-{rank}"), per_device_train_batch_size=2, report_to=[],
        use_cpu=True, disable_tqdm=True, logging_strategy="no", num_train_epochs=1, save_strategy="no",
        ddp_backend="gloo")
    # Rank 0 gives the callback to the trainer, rank 1 adds it to the trainer made without it.
    given = [TraceCallback()] if rank == 0 else []
    trainer = transformers.Trainer(model=transformers.BertForSequenceClassification(config), args=args,
                                   train_dataset=data, callbacks=[*given, Slow()])
    if not given:
        trainer.add_callback(TraceCallback())
    trainer.train()
    dftrace.finalize()
    with open(os.path.join(truth, f"truth-{rank}.json"), "w") as f:
        json.dump({"rank": rank, "pid": os.getpid(), "steps": trainer.state.global_step, "slept_s": slept[0],
                   "wrapped": type(trainer.model_wrapped).__name__}, f)


if __name__ == "__main__":
    import torch.multiprocessing as mp

    mp.spawn(run, args=(2, sys.argv[1], sys.argv[2], sys.argv[3]), nprocs=2, join=True)
