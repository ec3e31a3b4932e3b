"""The model zoo: real graphs nobody on the project chose, the measure of the compiler.

    import zoo
    for m in zoo.models():                  # zoo/manifest.toml, in order
        path = m.path()                     # the ONNX file (a wheel's, or exported into the cache)
        calib = m.feeds(32, seed=0)         # real inputs where they exist (zoo/data.py)
        ref = zoo.ort_run(path, m.ort_feeds(calib[0]))

tests/zoo and bench/zoo.py share this loader. Nothing here is needed by the qcompiler package.
"""
from .loader import (CACHE, ZooModel, get, models, ort_quantize_dynamic, ort_quantize_static, ort_run,  # noqa: F401
                     ort_session, sqnr_db)
