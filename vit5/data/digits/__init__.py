"""Built-in handwritten digits (scikit-learn ``load_digits``): in memory or as files (`vit5 data digits`)."""

from vit5.data.digits.export import ExportReport, export_digits_imagefolder
from vit5.data.digits.split import DIGIT_CLASSES, DigitsDataset, DigitsSplit, load_digits_split

__all__ = [
    "DIGIT_CLASSES",
    "DigitsDataset",
    "DigitsSplit",
    "ExportReport",
    "export_digits_imagefolder",
    "load_digits_split",
]
