"""The exporters of tmt-export: our model as a folder that another library runs.
`ctranslate2`: a CTranslate2 model, which tmt-translate and tmt-eval run too
(decode/ctranslate2_backend.py); `transformers`: a MarianMTModel folder with its model card. Each
folder holds decode/loading.EXPORT_INFO, the mark that a new export may replace it."""

from __future__ import annotations

from transformer_mt.errors import TransformerMTError
from transformer_mt.model import Transformer


def check_exportable(model: Transformer, target: str) -> None:
    """TransformerMTError unless `model` is our Transformer itself: a subclass may compute
    something that `target` cannot express."""
    if type(model) is not Transformer:
        raise TransformerMTError(
            f"cannot export a {type(model).__name__}: only transformer_mt.model.Transformer "
            f"maps onto {target}"
        )
