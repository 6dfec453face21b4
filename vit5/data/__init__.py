"""Data pipeline for ViT-5: OpenCV decoding, ImageFolder, WebDataset shards (``vit5[wds]``), DeiT-III
transforms, digits, RA sampler. Stands alone: imports no other ``vit5`` subpackage."""
# ruff: noqa: F401 (the re-exports are the public names)

from vit5.data.batched import BatchAugment, BatchLoader, batch_augment, preloaded_loader
from vit5.data.decode import BadImageError, decode_image
from vit5.data.digits import DigitsDataset, export_digits_imagefolder, load_digits_split
from vit5.data.folder import (
    IMAGE_EXTENSIONS,
    BadImageWarning,
    ImageFolderDataset,
    ImageFolderError,
    class_names_change,
    image_files,
)
from vit5.data.loader import STOP_SIGNALS, RepeatAugSampler, build_loader, ignore_stop_signals
from vit5.data.shards import ShardDataset, ShardError, shard_loader, write_shards
from vit5.data.transforms import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    build_transform,
    eval_transform,
    pad_crop_transform,
    randaug_transform,
    resize_transform,
    rrc_transform,
    three_augment,
)
