"""xfmr: transformer models with hand-derived backward passes, from Python.

load() reads a model (an xfmr checkpoint, a Hugging Face GPT-2, Llama or
Qwen2 directory, or a llama2.c file) and create() makes a new one; a Model
generates, streams and gives logits, a Trainer trains it, and quantise()
writes a 4- or 8-bit copy for decoding. Errors are xfmr.Error. The work is
the compiled extension's, xfmr._xfmr (python/xfmr.cpp, over the C++
library); this package re-exports its public names, and __init__.pyi types
them. docs/python.md shows it in use.
"""
from ._xfmr import Completion, Error, Model, Tokenizer, TokenStream, Trainer, create, load, presets, quantise

__all__ = ["Completion", "Error", "Model", "Tokenizer", "TokenStream", "Trainer", "create", "load", "presets",
           "quantise"]

# The names are the package's: reprs, tracebacks and help() say xfmr.Error, as before the package.
for _name in __all__:
    globals()[_name].__module__ = __name__
del _name
