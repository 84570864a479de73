"""Rewrites of exported ONNX files that change their bytes, not what they compute."""

from __future__ import annotations

import numpy as np


def fold_constant_shapes(path: str) -> list[str]:
    """Rewrites the ONNX file ``path`` so that every ``Shape`` of an initializer is a constant,
    and drops the initializers nothing reads any more; returns their names. tf2onnx keeps a
    (heads, N, N) probability constant a second time in another layout only for its ``Shape``:
    a dead copy that is a fifth of a paper model's file."""
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(path)
    graph = model.graph
    dims = {i.name: list(i.dims) for i in graph.initializer}
    for index, node in enumerate(graph.node):
        if node.op_type == "Shape" and node.input[0] in dims:
            attributes = {a.name: a.i for a in node.attribute}
            shape = np.array(dims[node.input[0]], np.int64)[attributes.get("start", 0):attributes.get("end", None)]
            graph.node[index].CopyFrom(helper.make_node("Constant", [], list(node.output), name=node.name,
                                                        value=numpy_helper.from_array(shape, f"{node.name}_value")))
    read = {name for node in graph.node for name in node.input} | {o.name for o in graph.output}
    dropped = [i.name for i in graph.initializer if i.name not in read]
    kept = [i for i in graph.initializer if i.name in read]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    inputs = [i for i in graph.input if i.name not in dropped]  # IR < 4 lists initializers as inputs too
    del graph.input[:]
    graph.input.extend(inputs)
    onnx.save(model, path)
    return dropped


FLOAT16_MAX = 65504.0


def store_float16(path: str, names=None, min_elements: int = 2**12) -> list[str]:
    """Rewrites the ONNX file ``path`` so that its float32 initializers ``names`` (None: those with
    at least ``min_elements`` entries, all finite and inside float16's range, the ones that matter
    to the file's size) are stored as float16, each read through a ``Cast`` to float32 under its
    old name: the graph computes what it computed, on values rounded to float16, in half the bytes
    (ONNX Runtime folds the casts when it loads the file). Returns the names stored so."""
    import onnx
    from onnx import numpy_helper

    def chosen(initializer, values):
        if names is not None:
            return initializer.name in names
        return (values.size >= min_elements and np.isfinite(values).all()
                and np.abs(values).max() < FLOAT16_MAX)

    model = onnx.load(path)
    graph, casts = model.graph, []
    for initializer in graph.initializer:
        if initializer.data_type != onnx.TensorProto.FLOAT:
            continue
        values = numpy_helper.to_array(initializer)
        if chosen(initializer, values):
            name = initializer.name
            initializer.CopyFrom(numpy_helper.from_array(values.astype(np.float16), f"{name}_float16"))
            casts.append(onnx.helper.make_node("Cast", [f"{name}_float16"], [name], to=onnx.TensorProto.FLOAT,
                                               name=f"{name}_to_float32"))
    for i, cast in enumerate(casts):
        graph.node.insert(i, cast)
    onnx.save(model, path)
    return sorted(cast.output[0] for cast in casts)
