"""What an export computes in (``--precision``): one class per precision, chosen once
(`resolve`). A precision makes the serving copy the files are written from, says which files an
export in it writes (`formats`, from `export.formats.FORMATS` and `export.int8.QUANTIZED`), how a file is checked
against the float32 Keras model (`check`) and what ``metadata.json`` records (`record`)."""

from __future__ import annotations

import numpy as np

import sa_conv
from export import formats, int8, runtimes
from export.verify import ExportError, bfloat16_probability_tolerance, max_error
from trainers import precision as precision_lib

class Precision:
    """float32: every file computes as the Keras model does, to float32's bound."""

    name = "float32"
    checks_agreement = False  # whether its files are checked by top-1 agreement (--agreement_images)

    def __init__(self, why: str = "requested"):
        self.why = why

    def serving_copy(self, model):
        """The copy of the trained ``model`` the files are written from."""
        return sa_conv.freeze_for_inference(model)

    # The float files this precision writes beyond --formats, with why: {format name: reason}.
    added: dict = {}

    def formats(self, requested) -> list[formats.Format]:
        """The files an export asked for ``requested`` (``--formats``) writes, in order."""
        return [fmt for name, fmt in formats.FORMATS.items() if name in requested or name in self.added]

    def describe(self, fmt: formats.Format) -> str:
        """How messages name ``fmt``'s file in this precision."""
        return fmt.what

    def check(self, fmt: formats.Format, served, job: formats.ExportJob) -> dict:
        """``served`` (``fmt``'s file as a function of images) against the float32 model."""
        error = max_error(f"The {self.describe(fmt)}", job.expected, served(job.images), fmt.tolerance)
        return {"max_abs_error": error, "tolerance": fmt.tolerance}

    def record(self, checks: dict) -> dict:
        """``metadata.json``'s ``precision`` from ``{format: {**written, **checked}}``."""
        return {"dtype": self.name, "why": self.why}


class BFloat16(Precision):
    """bfloat16 compute (float32 weights and encodings; `sa_conv.with_dtype_policy`), a
    SavedModel only: checked against the bfloat16 Keras model it was written from, to bfloat16's
    bound, then by its top-1 agreement with the float32 model."""

    name = "bfloat16"
    checks_agreement = True

    def serving_copy(self, model):
        return sa_conv.freeze_for_inference(sa_conv.with_dtype_policy(model, "mixed_bfloat16"))

    def formats(self, requested):
        if set(requested) - {"saved_model"}:
            raise ExportError("--precision=bfloat16 writes a SavedModel only; export TFLite, ONNX and OpenVINO in float32 "
                              "(OpenVINO infers in bfloat16 by itself on CPUs with AVX512_BF16 or AMX).")
        return super().formats(requested)

    def describe(self, fmt):
        return f"bfloat16 {fmt.what}"

    def check(self, fmt, served, job):
        logits = job.serving.predict(job.images, verbose=0)
        tolerance = bfloat16_probability_tolerance(logits)
        expected = runtimes.softmax(np.asarray(logits, np.float32))
        error = max_error(f"The {self.describe(fmt)}", expected, served(job.images), tolerance)
        return {"max_abs_error": error, "tolerance": tolerance, **job.agreement(served, "bfloat16 export")}

    def record(self, checks):
        agreement = checks["saved_model"]
        return {**super().record(checks), "top1_agreement": agreement["top1_agreement"],
                "agreement_images": agreement["agreement_images"]}


class Int8(Precision):
    """int8 files beside the float32 ones (`export.int8`): the float32 SavedModel, the float32
    ONNX file (the int8 ONNX file's source, always written) and TFLite file where asked, and the
    int8 file of each."""

    name = "int8"
    checks_agreement = True
    added = {"onnx": "the int8 ONNX file is quantized from it"}

    def formats(self, requested):
        written = super().formats(requested)
        return written + [fmt for fmt in int8.QUANTIZED if fmt.quantizes in {f.name for f in written}]

    def record(self, checks):
        files = {fmt.quantizes: checks[fmt.name] for fmt in int8.QUANTIZED if fmt.name in checks}
        return {**super().record(checks), "saved_model": int8.SAVED_MODEL_DTYPE, "files": files}


PRECISIONS = {precision.name: precision for precision in (Precision, BFloat16, Int8)}
CHOICES = precision_lib.CHOICES + ("int8",)


def resolve(precision: str) -> Precision:
    """The `Precision` of ``--precision`` (``auto``: what `trainers.precision` picks here)."""
    if precision == "int8":
        return Int8()
    try:
        dtype, why = precision_lib.resolve(precision)
    except ValueError as exc:
        raise ExportError(f"--precision: {exc.args[0].replace('got', 'or int8, got')}") from None
    return PRECISIONS[dtype](why)
