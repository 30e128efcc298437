"""What the LoRA tests (lora_test.py, qlora_test.py) share: running the binary, a checkpoint's
directory, and the PEFT peer: AdamW steps of a PeftModel on the batches moe-train read
(unshuffled windows of the training shard), with moe-train's learning rate at each step and its
clipping; each step's loss is held to moe-train's within `rtol`."""
import subprocess

import h5py
import numpy as np
import peft
import torch


def runner(binary):
    """run(*args, ok=True): the binary's result; a failure where success was expected ends the
    test, naming the command and the end of its stderr."""
    def run(*args, ok=True):
        r = subprocess.run([binary, *map(str, args)], capture_output=True, text=True)
        if ok and r.returncode != 0:
            raise SystemExit(f"FAIL: {' '.join(map(str, args))}: exit {r.returncode}\n{r.stderr[-3000:]}")
        return r
    return run


def checkpoint(run_dir, step):
    return run_dir / "checkpoints" / f"step-{step:08d}"


def peft_steps(model, train_h5, ours, steps, batch, seq, rtol, fused=False, weight_decay=0.01):
    """Trains `model` (a trainable PeftModel, or a plain model for full fine-tuning) for `steps`
    steps; returns its adapter state dict (its whole state dict when not a PeftModel).
    `ours`: moe-train's metrics.jsonl train records (loss and lr per step)."""
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=weight_decay,
                            fused=fused)
    tokens = torch.from_numpy(h5py.File(train_h5)["tokens"][:].astype(np.int64))
    windows = tokens[: (tokens.numel() // (seq + 1)) * (seq + 1)].view(-1, seq + 1)
    worst = 0.0
    for step in range(steps):
        rows = windows[torch.arange(step * batch, (step + 1) * batch) % windows.shape[0]]
        for g in opt.param_groups:
            g["lr"] = ours[step]["lr"]
        opt.zero_grad()
        logits = model(input_ids=rows[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 rows[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        rel = abs(loss.item() - ours[step]["loss"]) / abs(loss.item())
        worst = max(worst, rel)
        assert rel <= rtol, (f"step {step + 1}: PEFT {loss.item():.7f} vs moe-train "
                             f"{ours[step]['loss']:.7f} (rel {rel:.1e})")
    print(f"  {steps} steps: worst relative loss difference vs the transformers peer {worst:.1e}")
    if isinstance(model, peft.PeftModel):
        return peft.get_peft_model_state_dict(model)
    return model.state_dict()
