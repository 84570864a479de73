"""Image files of every kind the trainer reads from a folder, written with Pillow, with the pixels
each should decode to: what the format tests of training (`tests/test_folder_data.py`) and of
serving (`tests/test_export.py`) share."""

import io

import numpy as np

HEIGHT, WIDTH = 40, 48  # not square and not the model's size: serving and training both resize


def _rgb(seed=0):
    return np.random.default_rng(seed).integers(0, 256, (HEIGHT, WIDTH, 3), dtype=np.uint8)


def _encode(image, fmt, **options):
    buffer = io.BytesIO()
    image.save(buffer, fmt, **options)
    return buffer.getvalue()


def files():
    """``{name: (bytes, pixels)}``: each file and the RGB pixels ``(H, W, 3)`` uint8 another decoder
    (Pillow) reads from it; for the 16-bit PNG, which Pillow clips, their top bytes."""
    from PIL import Image

    rgb = _rgb()
    gray = rgb[..., 0]
    palette = Image.fromarray(rgb).quantize(16)
    rgba = np.dstack([rgb, np.full((HEIGHT, WIDTH, 1), 200, np.uint8)])
    blobs = {
        "png_rgb": _encode(Image.fromarray(rgb), "PNG"),
        "png_gray": _encode(Image.fromarray(gray), "PNG"),
        "png_rgba": _encode(Image.fromarray(rgba), "PNG"),  # alpha dropped, as training does
        "png_palette": _encode(palette, "PNG"),
        "jpeg_rgb": _encode(Image.fromarray(rgb), "JPEG", quality=95),
        "jpeg_gray": _encode(Image.fromarray(gray), "JPEG", quality=95),
        "jpeg_cmyk": _encode(Image.fromarray(rgb).convert("CMYK"), "JPEG", quality=95),
        "bmp_rgb": _encode(Image.fromarray(rgb), "BMP"),
        "bmp_rgba": _encode(Image.fromarray(rgba), "BMP"),
        "bmp_gray": _encode(Image.fromarray(gray), "BMP"),
        "bmp_palette": _encode(palette, "BMP"),
        "gif_first_frame": _encode(palette, "GIF", save_all=True,
                                   append_images=[Image.fromarray(255 - rgb).quantize(16)]),
    }
    out = {name: (blob, np.asarray(Image.open(io.BytesIO(blob)).convert("RGB"))) for name, blob in blobs.items()}
    sixteen = Image.fromarray(gray.astype(np.uint16) * 257)  # 16-bit values whose top byte is the 8-bit one
    out["png_16bit"] = (_encode(sixteen, "PNG"), np.repeat(gray[..., None], 3, -1))
    return out


def one_bit_bmp():
    """A 1-bit BMP: a depth TensorFlow's decoder does not read."""
    from PIL import Image

    return _encode(Image.fromarray(_rgb()[..., 0] > 128), "BMP")


EXTENSION = {"png": ".png", "jpeg": ".jpg", "bmp": ".bmp", "gif": ".gif"}


def file_name(name):
    return name + EXTENSION[name.split("_")[0]]
