"""A torch network's calls captured as CUDA graphs and replayed (:func:`~emfast.predict`'s ``cuda_graphs=True``).

An eager torch network launches each of its kernels from Python, taking the GIL for every one; during a prediction
the reading, blending and writing threads hold the GIL often, so the launches fall behind the device. A captured
graph replays all of a call's kernels in one launch. The price is device memory: each graph keeps the network's
intermediate tensors in a pool of its own, and there is one graph per device slot (the copy back of one slot's
prediction overlaps the next call, so the two may not share memory).

Capturing requires a network whose work is the same on every call of a batch shape: no synchronisation with the
host (``.item()``, data-dependent shapes) and no Python state that changes between calls. A network that cannot be
captured is called eagerly, with a :class:`~emfast.DeviceNotice` saying why.
"""
from __future__ import annotations

import warnings
from typing import Dict, Optional, Tuple

from ..transfer import DeviceNotice
from ._model import called

#: Eager calls before the first capture, on a stream of their own: cuDNN's benchmark mode and lazy initialisation
#: happen there, not in the graph.
WARMUP_CALLS = 2


class CapturedNetwork:
    """Calls ``model`` through one CUDA graph per device slot, captured on first use: a batch that fills part of
    its slot is computed as the whole slot and its predictions cut out, so that every call is a replay. The tiles
    past the batch are an earlier batch's (or uninitialised memory): a network in inference computes each tile on
    its own, and their predictions are dropped. Once a capture failed, every call is eager."""

    def __init__(self) -> None:
        self._graphs: Dict[Tuple[int, tuple], Tuple[object, object]] = {}  # (address, shape) -> (graph, output)
        #: Why the network could not be captured (then every call is eager), or None.
        self.refused: Optional[str] = None

    @property
    def captured(self) -> int:
        """Graphs captured so far."""
        return len(self._graphs)

    def __call__(self, torch, model, slot, count: int):
        """``model(slot[:count])`` for ``slot``, a tensor over a whole device slot: replayed from a graph where
        possible, then a view of the graph's own output tensor, overwritten by that graph's next replay."""
        if self.refused is None:
            key = (slot.data_ptr(), tuple(slot.shape))
            captured = self._graphs.get(key) or self._capture(torch, model, slot, key)
            if captured is not None:
                graph, output = captured
                graph.replay()
                return output[:count]
        return called(model, slot[:count])

    def _capture(self, torch, model, tensor, key):
        try:
            with torch.cuda.device(tensor.device):
                current = torch.cuda.current_stream()
                if not self._graphs:  # once: what a warm-up initialises, it does for every slot
                    side = torch.cuda.Stream()
                    side.wait_stream(current)
                    with torch.cuda.stream(side):
                        for _ in range(WARMUP_CALLS):
                            model(tensor)
                    current.wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                # thread_local: other threads of the process (a user's, predict's own) may use CUDA meanwhile
                with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                    output = model(tensor)
                    if not isinstance(output, torch.Tensor):
                        raise TypeError(f"the network returned a {type(output).__name__}, not a tensor")
                    output = output.detach().contiguous()
        except Exception as error:  # noqa: BLE001 - any failure to capture means calling eagerly, said once
            self.refused = f"{type(error).__name__}: {error}"
            self._graphs.clear()
            warnings.warn(f"cuda_graphs: the network could not be captured as a CUDA graph ({self.refused}); it is "
                          "called eagerly", DeviceNotice, stacklevel=2)
            return None
        self._graphs[key] = graph, output
        return graph, output

    def clear(self) -> None:
        """Drop the graphs and their memory pools."""
        self._graphs.clear()
