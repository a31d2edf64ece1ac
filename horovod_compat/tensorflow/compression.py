"""Gradient compression applied around the reducing collectives."""

from typing import Any, Tuple

import tensorflow as tf


class Compressor:
    """Interface: compress before the collective, decompress after."""

    @staticmethod
    def compress(tensor: Any) -> Tuple[Any, Any]:
        """Returns the compressed tensor and the context decompress() needs."""
        raise NotImplementedError

    @staticmethod
    def decompress(tensor: Any, ctx: Any) -> Any:
        """Undoes compress()."""
        raise NotImplementedError


class NoneCompressor(Compressor):
    """No compression."""

    @staticmethod
    def compress(tensor: Any) -> Tuple[Any, Any]:
        return tensor, None

    @staticmethod
    def decompress(tensor: Any, ctx: Any) -> Any:
        return tensor


class FP16Compressor(Compressor):
    """Sends floating-point tensors as float16; other dtypes pass through unchanged."""

    @staticmethod
    def compress(tensor: Any) -> Tuple[Any, Any]:
        tensor_compressed = tensor
        if tensor.dtype.is_floating:
            tensor_compressed = tf.cast(tensor, dtype=tf.float16)
        return tensor_compressed, tensor.dtype

    @staticmethod
    def decompress(tensor: Any, ctx: Any) -> Any:
        tensor_decompressed = tensor
        dtype = ctx
        if dtype.is_floating:
            tensor_decompressed = tf.cast(tensor, dtype=dtype)
        return tensor_decompressed


class Compression:
    """The available compressors: ``Compression.none`` and ``Compression.fp16``."""

    none = NoneCompressor
    fp16 = FP16Compressor
