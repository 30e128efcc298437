"""What the Hugging Face parity tests share: transformers' logits of a model directory, the
comparison of moe-train's `eval --dump-logits` with them (logits and loss, each to its bar), a
run's newest checkpoint, and the checks after an export (transformers loads it cleanly and gives
our logits; import-hf of it is the trained checkpoint, bitwise)."""
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


def exported_matches(run, tmp, tag, cfg, trained, exported, steps, check):
    """`exported` (export-hf of `trained`) against transformers and back: no missing, unexpected
    or mismatched keys; `check(what, dump, model_dir, loss)` on the trained checkpoint's
    `eval --dump-logits`; import-hf of the export bitwise equal to `trained`. Returns the eval
    record."""
    _, info = transformers.AutoModelForCausalLM.from_pretrained(exported, output_loading_info=True)
    for k in ("missing_keys", "unexpected_keys", "mismatched_keys"):
        assert not info[k], f"{tag}: transformers reports {k}: {info[k]}"
    dump = tmp / f"logits-trained-{tag}.safetensors"
    r = json.loads(run("eval", "--config", cfg, "--checkpoint", trained, "--dump-logits", dump).stdout)
    assert r["step"] == steps
    check(f"trained {steps} steps, exported", dump, exported, r["loss"])
    again = tmp / f"reimported-{tag}"
    run("import-hf", exported, "--out", again)
    a, b = load_file(trained / "model.safetensors"), load_file(again / "model.safetensors")
    assert a.keys() == b.keys(), "same tensor names"
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), f"{tag}: {k} differs after the round trip"
    print(f"  import-hf of the export: {len(a)} tensors bitwise identical to the trained checkpoint")
    return r
