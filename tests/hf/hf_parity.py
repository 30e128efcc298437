"""What the Hugging Face parity tests share: transformers' logits of a model directory, the
comparison of moe-train's `eval --dump-logits` with them (logits and loss, each to its bar), and
a run's newest checkpoint."""
import json

import torch
import transformers
from safetensors.torch import load_file


def hf_logits(model_dir, tokens):
    m = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        return m(input_ids=tokens).logits


def compare(what, dump_path, model_dir, eval_loss, logits_tol, loss_rtol):
    """transformers' logits and loss on the dumped windows against moe-train's."""
    d = load_file(dump_path)
    windows, ours = d["tokens"], d["logits"]
    theirs = hf_logits(model_dir, windows[:, :-1])
    diff = (theirs - ours).abs().max().item()
    loss = torch.nn.functional.cross_entropy(theirs.double().reshape(-1, theirs.shape[-1]),
                                             windows[:, 1:].reshape(-1)).item()
    rel = abs(loss - eval_loss) / abs(loss)
    print(f"  {what}: {windows.shape[0]} windows x {windows.shape[1] - 1} tokens: max |logit diff| "
          f"{diff:.2e}, loss transformers {loss:.8f} moe-train {eval_loss:.8f} (rel {rel:.1e})")
    assert diff <= logits_tol, f"{what}: logits differ by {diff}"
    assert rel <= loss_rtol, f"{what}: loss differs by {rel} relative"


def newest_checkpoint(run_dir):
    cks = sorted(p for p in (run_dir / "checkpoints").iterdir() if (p / "state.json").exists())
    return max(cks, key=lambda p: json.loads((p / "state.json").read_text())["step"])
