"""Post-training quantization: calibration data, range observers, quantization parameters.

    data.py        calibration / evaluation data as a stream of feeds (images, .npy/.npz, random)
    observers.py   streaming range observers: MinMax, Percentile, Entropy (KL), MSE
    calibrate.py   collect_ranges: run the model once over the data, observe chosen values
    qparams.py     ranges -> QuantParams (the reference quantize/dequantize: qcompiler.ir.types)

    from qcompiler.quant import open_dataset, collect_ranges, asymmetric
    ds = open_dataset("calib/", graph.inputs, samples=256)
    ranges = collect_ranges(graph, ds, ["conv1_out"], "percentile", p=99.99)
    qp = asymmetric(*ranges["conv1_out"])            # !quant.uniform<u8:f32, ...>
"""
from .calibrate import collect_ranges, observe
from .data import Dataset, Preprocess, Progress, open_dataset, random_dataset
from .observers import MSE, Entropy, Method, MinMax, Observer, Percentile, make_observer
from .qparams import asymmetric, bias_params, fake_quantize, per_channel_symmetric, sqnr_db, symmetric

__all__ = ["collect_ranges", "observe", "Dataset", "Preprocess", "Progress", "open_dataset", "random_dataset",
           "MSE", "Entropy", "Method", "MinMax", "Observer", "Percentile", "make_observer", "asymmetric",
           "bias_params", "fake_quantize", "per_channel_symmetric", "sqnr_db", "symmetric"]
