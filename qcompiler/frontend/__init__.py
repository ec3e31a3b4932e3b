"""Model formats in and out of the IR: ONNX import (:func:`import_onnx`) and export (:func:`export_onnx`)."""
from .onnx_import import ImportMismatch, import_onnx, supported_ops
from .onnx_export import ExportError, export_onnx, save_onnx

__all__ = ["import_onnx", "supported_ops", "ImportMismatch", "export_onnx", "save_onnx", "ExportError"]
