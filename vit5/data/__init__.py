"""Data pipeline for ViT-5: OpenCV decoding, ImageFolder, WebDataset shards (``vit5[wds]``), DeiT-III
transforms, digits, RA sampler. Stands alone: imports no other ``vit5`` subpackage."""

from vit5.data.decode import MAX_PIXELS_ENV, BadImageError, decode_image, max_image_pixels
from vit5.data.digits import (
    DIGIT_CLASSES,
    DigitsDataset,
    DigitsSplit,
    ExportReport,
    export_digits_imagefolder,
    load_digits_split,
)
from vit5.data.folder import (
    IMAGE_EXTENSIONS,
    BadImageWarning,
    ImageFolderDataset,
    ImageFolderError,
    class_names_change,
    image_files,
)
from vit5.data.loader import STOP_SIGNALS, build_loader, ignore_stop_signals
from vit5.data.randaug import TimmRandAugment
from vit5.data.sampler import RepeatAugSampler, SeededSamples, sample_seed
from vit5.data.shard_writer import ShardReport, write_shards
from vit5.data.shards import ShardDataset, ShardError, expand_shards, shard_loader
from vit5.data.transforms import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    ImageTransform,
    TransformKind,
    build_transform,
    eval_transform,
    pad_crop_transform,
    randaug_transform,
    resize_transform,
    three_augment,
)

__all__ = [
    "DIGIT_CLASSES",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "IMAGE_EXTENSIONS",
    "MAX_PIXELS_ENV",
    "image_files",
    "BadImageError",
    "BadImageWarning",
    "DigitsDataset",
    "DigitsSplit",
    "ExportReport",
    "ImageFolderDataset",
    "ImageFolderError",
    "ImageTransform",
    "RepeatAugSampler",
    "STOP_SIGNALS",
    "SeededSamples",
    "ShardDataset",
    "ShardError",
    "ShardReport",
    "TimmRandAugment",
    "TransformKind",
    "build_loader",
    "ignore_stop_signals",
    "sample_seed",
    "class_names_change",
    "build_transform",
    "decode_image",
    "max_image_pixels",
    "eval_transform",
    "pad_crop_transform",
    "expand_shards",
    "export_digits_imagefolder",
    "load_digits_split",
    "randaug_transform",
    "resize_transform",
    "shard_loader",
    "three_augment",
    "write_shards",
]
