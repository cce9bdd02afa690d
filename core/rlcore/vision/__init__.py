"""Vision-language models: images from the data to the rollout and into training (docs/vision.md).

- :mod:`rlcore.vision.images`: a row's images, read and checked when the data loads.
- :mod:`rlcore.vision.prompts`: the ``<image>`` placeholder, image parts, the expanded image tokens.
- :mod:`rlcore.vision.inputs`: the model's own processor: image tokens, pixels, the request's media.
"""

from rlcore.vision.images import load_images
from rlcore.vision.inputs import VisionInputs, check_multi_modal, is_vision_model, model_class
from rlcore.vision.prompts import IMAGE_PLACEHOLDER, expand_image_tokens, image_parts

__all__ = [
    "IMAGE_PLACEHOLDER",
    "VisionInputs",
    "check_multi_modal",
    "expand_image_tokens",
    "image_parts",
    "is_vision_model",
    "load_images",
    "model_class",
]
