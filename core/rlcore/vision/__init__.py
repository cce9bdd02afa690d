"""Vision-language models: images from the data to the rollout and into training (docs/vision.md).

- :mod:`rlcore.data.images`: a row's images, read and checked when the data loads; the ``<image>``
  placeholder as image parts of the chat messages.
- :mod:`rlcore.vision.inputs`: the model's own processor: each image's tokens, pixels, the request's media.
"""

from rlcore.data.images import IMAGE_PLACEHOLDER, image_parts, load_images
from rlcore.vision.inputs import (
    VisionInputs,
    check_multi_modal,
    expand_image_tokens,
    is_vision_model,
    model_class,
)

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
