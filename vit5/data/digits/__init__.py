"""Built-in handwritten digits data set (scikit-learn ``load_digits``): in memory or as files.

Run ``vit5 data digits ROOT`` to write an ImageFolder tree.
"""

from vit5.data.digits.dataset import DigitsDataset
from vit5.data.digits.export import ExportReport, export_digits_imagefolder
from vit5.data.digits.split import DIGIT_CLASSES, DigitsSplit, load_digits_split

__all__ = [
    "DIGIT_CLASSES",
    "DigitsDataset",
    "DigitsSplit",
    "ExportReport",
    "export_digits_imagefolder",
    "load_digits_split",
]
