"""Native decoders against the reference libraries: Pillow for images, numpy
for .npy, Python's int() for labels. Pixel comparisons are exact (max diff 0)."""

import io
import struct
import warnings
import zlib

import chute_testing
import numpy as np
import pytest
from chute import _core
from PIL import Image, ImageFile

# scripts/sanitize.sh runs the tests marked native under ASan and TSan.
pytestmark = pytest.mark.native

# Pillow's JPEG encoder sizes its output buffer for photos; a progressive
# quality-95 4:4:4 JPEG of noise does not fit ("Suspension not allowed here").
ImageFile.MAXBLOCK = 1 << 22

WHERE = "shard 'test.tar', member 'a/b.x' at offset 1234"


# ---------------------------------------------------------------- generators


def noise(h, w, c, seed):
    shape = (h, w) if c == 1 else (h, w, c)
    return np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)


def gradient(h, w, c, seed):
    """Smooth content with a little noise: what photos look like to a codec."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float64)
    planes = []
    for _ in range(c):
        a, b, p = rng.uniform(0.01, 0.2, 3)
        v = 127 + 100 * np.sin(a * xx + p) * np.cos(b * yy) + rng.normal(0, 6, (h, w))
        planes.append(v)
    out = np.clip(np.stack(planes, -1), 0, 255).astype(np.uint8)
    return out[..., 0] if c == 1 else out


SIZES = [(1, 1), (2, 3), (17, 33), (33, 17), (31, 7), (64, 64), (256, 256)]
CONTENT = {"noise": noise, "gradient": gradient}


def pil_bytes(img, fmt, **kw):
    buf = io.BytesIO()
    img.save(buf, format=fmt, **kw)
    return buf.getvalue()


def pil_decode(data, mode):
    with warnings.catch_warnings():
        # Pillow warns about palette transparency given as bytes; the pixels
        # are what we compare, and convert() ignores the transparency.
        warnings.simplefilter("ignore")
        return np.asarray(Image.open(io.BytesIO(data)).convert(mode))


def assert_same_as_pillow(data):
    for mode, ours in (("RGB", "rgb"), ("L", "l")):
        expected = pil_decode(data, mode)
        got = chute_testing.decode_image(data, ours)
        assert got.dtype == np.uint8
        assert got.shape == expected.shape, (mode, got.shape, expected.shape)
        diff = np.abs(got.astype(np.int16) - expected.astype(np.int16)).max()
        assert diff == 0, f"{mode}: max diff {diff}"


# ---------------------------------------------------------------- JPEG

JPEG_SETTINGS = [
    {"quality": 75},
    {"quality": 95},
    {"quality": 90, "subsampling": 0},  # 4:4:4
    {"quality": 90, "subsampling": 1},  # 4:2:2
    {"quality": 90, "subsampling": 2},  # 4:2:0
    {"quality": 75, "progressive": True},
    {"quality": 95, "progressive": True, "subsampling": 0},
    {"quality": 85, "optimize": True},
]


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("content", sorted(CONTENT))
@pytest.mark.parametrize("settings", JPEG_SETTINGS, ids=lambda s: repr(s))
def test_jpeg_color_matches_pillow(size, content, settings):
    h, w = size
    img = Image.fromarray(CONTENT[content](h, w, 3, seed=h * 1000 + w))
    data = pil_bytes(img, "JPEG", **settings)
    assert _core.probe_image(data) == ("jpeg", w, h)
    assert_same_as_pillow(data)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("settings", [{"quality": 75}, {"quality": 95, "progressive": True}])
def test_jpeg_grayscale_matches_pillow(size, settings):
    h, w = size
    data = pil_bytes(Image.fromarray(gradient(h, w, 1, seed=7), "L"), "JPEG", **settings)
    assert Image.open(io.BytesIO(data)).mode == "L"
    assert_same_as_pillow(data)
    # The gray path hands out the stored luma; RGB replicates it.
    rgb = chute_testing.decode_image(data, "rgb")
    assert (rgb == chute_testing.decode_image(data, "l")[..., None]).all()


@pytest.mark.parametrize("size", [(1, 1), (17, 33), (64, 64)])
def test_jpeg_cmyk_matches_pillow(size):
    # Pillow writes CMYK JPEGs Adobe-style (inverted); on reading it inverts
    # them back ("CMYK;I") and convert("RGB") computes nk - nk*C/255.
    h, w = size
    img = Image.fromarray(noise(h, w, 4, seed=3), "CMYK")
    data = pil_bytes(img, "JPEG", quality=90)
    assert Image.open(io.BytesIO(data)).mode == "CMYK"
    assert_same_as_pillow(data)


def test_jpeg_decoder_is_reused_across_images():
    # Thread-local decoder state must not leak from one image (or one error)
    # into the next.
    datas = [
        pil_bytes(Image.fromarray(gradient(h, w, 3, seed=h)), "JPEG", quality=80)
        for h, w in [(40, 30), (8, 100), (40, 30)]
    ]
    bad = datas[0][: len(datas[0]) // 2]
    for data in datas + [bad] + datas:
        if data is bad:
            with pytest.raises(_core.DataError):
                chute_testing.decode_image(data)
        else:
            assert_same_as_pillow(data)


def test_decoding_from_many_threads_matches_serial():
    # The decoders keep per-thread state and run without the GIL.
    from concurrent.futures import ThreadPoolExecutor

    datas = []
    for i in range(24):
        img = Image.fromarray(gradient(20 + i, 30 + 2 * i, 3, seed=i))
        datas.append(pil_bytes(img, "JPEG", quality=70 + i, progressive=i % 3 == 0))
        datas.append(pil_bytes(img.convert("L" if i % 2 else "RGBA"), "PNG"))
    datas.append(datas[0][:100])  # errors interleaved with good images
    modes = ["rgb", "l"]

    def run(item):
        data, mode = item
        try:
            return chute_testing.decode_image(data, mode)
        except _core.DataError:
            return None

    items = [(d, m) for d in datas for m in modes] * 4
    serial = [run(item) for item in items]
    with ThreadPoolExecutor(4) as pool:
        parallel = list(pool.map(run, items))
    for a, b in zip(serial, parallel, strict=True):
        assert (a is None and b is None) or np.array_equal(a, b)


def test_dispatch_ignores_extension_like_names():
    # Formats are chosen by magic bytes: a PNG stored as "x.jpg" decodes.
    png = pil_bytes(Image.fromarray(noise(5, 6, 3, seed=1)), "PNG")
    assert _core.probe_image(png, where="member 'x.jpg'") == ("png", 6, 5)
    assert_same_as_pillow(png)


# ---------------------------------------------------------------- PNG

PIL_PNG_MODES = ["L", "LA", "RGB", "RGBA", "1", "I;16"]


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("mode", PIL_PNG_MODES)
def test_png_modes_match_pillow(size, mode):
    h, w = size
    if mode == "1":
        img = Image.fromarray(noise(h, w, 1, seed=5) > 127)
    elif mode == "I;16":
        # Spans values above 255, which Pillow's I;16 -> L/RGB clips to 255.
        arr = np.random.default_rng(5).integers(0, 700, (h, w)).astype(np.uint16)
        img = Image.fromarray(arr)
    else:
        channels = {"L": 1, "LA": 2, "RGB": 3, "RGBA": 4}[mode]
        arr = noise(h, w, channels, seed=5)
        img = Image.fromarray(arr, mode)
    assert img.mode == mode
    data = pil_bytes(img, "PNG")
    assert _core.probe_image(data) == ("png", w, h)
    assert_same_as_pillow(data)


@pytest.mark.parametrize("colors", [2, 4, 16, 256])
@pytest.mark.parametrize("transparency", [False, True])
def test_png_palette_matches_pillow(colors, transparency):
    rgb = Image.fromarray(gradient(33, 17, 3, seed=colors))
    img = rgb.quantize(colors=colors)
    kw = {}
    if transparency:
        kw["transparency"] = bytes(range(0, 256, 256 // colors))[:colors]
    data = pil_bytes(img, "PNG", **kw)
    assert Image.open(io.BytesIO(data)).mode == "P"
    assert_same_as_pillow(data)


# Hand-written PNGs: Pillow cannot write interlaced or 16-bit color PNGs.

ADAM7 = [
    (0, 0, 8, 8),
    (4, 0, 8, 8),
    (0, 4, 4, 8),
    (2, 0, 4, 4),
    (0, 2, 2, 4),
    (1, 0, 2, 2),
    (0, 1, 1, 2),
]


def png_chunk(kind, payload):
    crc = zlib.crc32(kind + payload) & 0xFFFFFFFF
    return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", crc)


def pack_rows(pixels, bit_depth):
    """(h, w, c) samples -> scanlines with filter byte 0."""
    h = pixels.shape[0]
    flat = pixels.reshape(h, -1)
    out = []
    for row in flat:
        if bit_depth == 16:
            data = row.astype(">u2").tobytes()
        elif bit_depth == 8:
            data = row.astype(np.uint8).tobytes()
        else:
            per_byte = 8 // bit_depth
            padded = np.zeros(-(-len(row) // per_byte) * per_byte, dtype=np.uint8)
            padded[: len(row)] = row
            groups = padded.reshape(-1, per_byte).astype(np.uint16)
            shifts = bit_depth * np.arange(per_byte - 1, -1, -1)
            data = (groups << shifts).sum(1).astype(np.uint8).tobytes()
        out.append(b"\x00" + data)
    return b"".join(out)


def make_png(
    pixels, color_type, bit_depth, interlace=False, palette=None, trns=None, ihdr_size=None
):
    pixels = pixels if pixels.ndim == 3 else pixels[..., None]
    h, w = pixels.shape[:2]
    if interlace:
        raw = b"".join(
            pack_rows(pixels[y0::dy, x0::dx], bit_depth)
            for x0, y0, dx, dy in ADAM7
            if pixels[y0::dy, x0::dx].size
        )
    else:
        raw = pack_rows(pixels, bit_depth)
    ih, iw = ihdr_size or (h, w)
    ihdr = struct.pack(">IIBBBBB", iw, ih, bit_depth, color_type, 0, 0, int(interlace))
    chunks = png_chunk(b"IHDR", ihdr)
    if palette is not None:
        chunks += png_chunk(b"PLTE", palette.astype(np.uint8).tobytes())
    if trns is not None:
        chunks += png_chunk(b"tRNS", trns)
    chunks += png_chunk(b"IDAT", zlib.compress(raw)) + png_chunk(b"IEND", b"")
    return b"\x89PNG\r\n\x1a\n" + chunks


def hand_png_cases():
    rng = np.random.default_rng(11)
    cases = []
    for interlace in (False, True):
        for h, w in [(1, 1), (3, 5), (9, 9), (17, 33)]:
            for color_type, channels, depths in [
                (0, 1, (1, 2, 4, 8, 16)),
                (2, 3, (8, 16)),
                (4, 2, (8, 16)),
                (6, 4, (8, 16)),
            ]:
                for depth in depths:
                    px = rng.integers(0, 1 << depth, (h, w, channels))
                    cases.append(
                        (
                            f"ct{color_type}-{depth}bit-{h}x{w}-i{int(interlace)}",
                            make_png(px, color_type, depth, interlace),
                        )
                    )
            for depth in (1, 2, 4, 8):
                n = 1 << depth
                palette = rng.integers(0, 256, (n, 3))
                px = rng.integers(0, n, (h, w))
                trns = rng.integers(0, 256, n // 2 + 1).astype(np.uint8).tobytes()
                for t in (None, trns):
                    cases.append(
                        (
                            f"palette-{depth}bit-{h}x{w}-i{int(interlace)}-t{t is not None}",
                            make_png(px, 3, depth, interlace, palette=palette, trns=t),
                        )
                    )
            # tRNS on gray and RGB: Pillow keeps it as info, convert ignores it.
            px = rng.integers(0, 256, (h, w, 3))
            cases.append(
                (
                    f"rgb-trns-{h}x{w}-i{int(interlace)}",
                    make_png(px, 2, 8, interlace, trns=struct.pack(">HHH", 1, 2, 3)),
                )
            )
            px = rng.integers(0, 256, (h, w))
            cases.append(
                (
                    f"gray-trns-{h}x{w}-i{int(interlace)}",
                    make_png(px, 0, 8, interlace, trns=struct.pack(">H", 7)),
                )
            )
    return cases


HAND_PNGS = hand_png_cases()


@pytest.mark.parametrize("data", [c[1] for c in HAND_PNGS], ids=[c[0] for c in HAND_PNGS])
def test_hand_written_png_matches_pillow(data):
    assert_same_as_pillow(data)


def test_png_16bit_keeps_high_byte_and_gray16_clips():
    # Pillow's documented-by-behaviour rules that the decoder reproduces.
    rgb16 = np.array([[[0x1280, 0x34FF, 0xFF01], [0x0001, 0x00FF, 0xFFF0]]])
    assert chute_testing.decode_image(make_png(rgb16, 2, 16)).tolist() == [
        [[0x12, 0x34, 0xFF], [0, 0, 0xFF]]
    ]
    gray16 = np.array([[0, 100, 255, 256, 1000, 65535]])
    assert chute_testing.decode_image(make_png(gray16, 0, 16), "l").tolist() == [
        [0, 100, 255, 255, 255, 255]
    ]


# ---------------------------------------------------------------- bad images


def sample_jpeg(progressive=False):
    img = Image.fromarray(gradient(64, 64, 3, seed=1))
    return pil_bytes(img, "JPEG", quality=90, progressive=progressive)


def sample_png():
    return pil_bytes(Image.fromarray(gradient(32, 32, 3, seed=2)), "PNG")


def assert_data_error(fn, *args, match=None):
    with pytest.raises(_core.DataError) as info:
        fn(*args, where=WHERE)
    message = str(info.value)
    assert WHERE in message, message
    if match:
        assert match in message, message
    return message


@pytest.mark.parametrize("progressive", [False, True])
@pytest.mark.parametrize("fraction", [0.0, 0.01, 0.1, 0.25, 0.5, 0.9, -2, -1])
def test_truncated_jpeg_raises(progressive, fraction):
    data = sample_jpeg(progressive)
    cut = int(len(data) * fraction) if fraction >= 0 else len(data) + fraction
    cut = max(cut, 3)  # keep the magic so the JPEG path is exercised
    truncated = data[:cut]
    # Pillow refuses all of these too ("image file is truncated").
    with pytest.raises(OSError):
        pil_decode(truncated, "RGB")
    assert_data_error(chute_testing.decode_image, truncated, "rgb")
    assert_data_error(chute_testing.decode_image, truncated, "l")


def find_marker(data, marker):
    pos = data.index(bytes([0xFF, marker]))
    return pos


def test_corrupt_jpeg_raises():
    data = sample_jpeg()
    sos = find_marker(data, 0xDA)
    # An EOI in the middle of the entropy-coded data: libjpeg would pad the
    # rest with gray ("premature end of data segment"); we refuse.
    mid = (sos + len(data)) // 2
    cut_scan = data[:mid] + b"\xff\xd9" + data[mid:]
    assert_data_error(chute_testing.decode_image, cut_scan, match="Corrupt JPEG data")
    # Broken frame header: zero components.
    sof = find_marker(data, 0xC0)
    bad_sof = bytearray(data)
    bad_sof[sof + 9] = 0
    assert_data_error(chute_testing.decode_image, bytes(bad_sof))
    assert_data_error(_core.probe_image, bytes(bad_sof))
    # Garbage instead of the Huffman tables.
    dht = find_marker(data, 0xC4)
    bad_dht = bytearray(data)
    bad_dht[dht + 4 : dht + 40] = b"\xff" * 36
    assert_data_error(chute_testing.decode_image, bytes(bad_dht))


def test_entropy_only_decode_loop_reads_whole_jpegs_and_refuses_others():
    """The benchmark floor reads every coefficient: a JPEG cut short fails as
    the full decode does, and a PNG (no entropy-only path) is refused."""
    data = sample_jpeg()
    assert _core.decode_loop([data], 0.01, entropy_only=True) > 0
    sos = find_marker(data, 0xDA)
    mid = (sos + len(data)) // 2
    cut_scan = data[:mid] + b"\xff\xd9" + data[mid:]
    with pytest.raises(_core.DataError, match="Corrupt JPEG data"):
        _core.decode_loop([cut_scan], 0.01, entropy_only=True)
    png = pil_bytes(Image.fromarray(noise(8, 8, 3, 0)), "PNG")
    with pytest.raises(ValueError, match="JPEGs only"):
        _core.decode_loop([data, png], 0.01, entropy_only=True)


def test_corrupt_png_raises():
    data = sample_png()
    idat = data.index(b"IDAT")
    idat_len = struct.unpack(">I", data[idat - 4 : idat])[0]
    bad = bytearray(data)
    bad[idat + 4 + idat_len] ^= 0xFF  # the stored CRC no longer matches
    assert_data_error(chute_testing.decode_image, bytes(bad), "rgb", match="CRC")
    bad = bytearray(data)
    bad[idat + 10] ^= 0xFF  # payload changes: zlib or the CRC check refuses it
    assert_data_error(chute_testing.decode_image, bytes(bad), "rgb")
    bad_ihdr = bytearray(data)
    bad_ihdr[16] ^= 0x01  # width, under the IHDR CRC
    assert_data_error(chute_testing.decode_image, bytes(bad_ihdr), "rgb")
    assert_data_error(_core.probe_image, bytes(bad_ihdr))
    for cut in (8, 20, 40, len(data) // 2, len(data) - 20):
        assert_data_error(chute_testing.decode_image, data[:cut], "rgb")
    # A bad CRC on an ancillary chunk: Pillow refuses it, so do we.
    text = bytearray(png_chunk(b"tEXt", b"k\x00v"))
    text[-1] ^= 0xFF
    with_text = data[:33] + bytes(text) + data[33:]
    with pytest.raises(OSError):  # "broken PNG file", surfaced as UnidentifiedImageError
        pil_decode(with_text, "RGB")
    assert_data_error(chute_testing.decode_image, with_text, "rgb")


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"hello world",
        b"GIF89a" + b"\x00" * 20,
        b"\xff\xd8",
        b"\x89PNG\r\n",
        b"<html>not found</html>",
    ],
)
def test_non_image_bytes_raise(data):
    assert_data_error(chute_testing.decode_image, data, "rgb")
    assert_data_error(_core.probe_image, data)


def jpeg_with_size(height, width):
    data = bytearray(sample_jpeg())
    sof = find_marker(bytes(data), 0xC0)
    struct.pack_into(">HH", data, sof + 5, height, width)
    return bytes(data)


def png_with_size(height, width):
    return make_png(np.zeros((2, 2, 3)), 2, 8, ihdr_size=(height, width))


@pytest.mark.parametrize("make", [jpeg_with_size, png_with_size])
def test_image_size_limits(make):
    assert_data_error(_core.probe_image, make(0, 0))
    assert_data_error(chute_testing.decode_image, make(0, 0), "rgb")
    assert_data_error(_core.probe_image, make(60000, 60000), match="limit")
    assert_data_error(chute_testing.decode_image, make(60000, 60000), "rgb", match="limit")


def test_bad_mode_is_usage_error():
    with pytest.raises(ValueError):
        chute_testing.decode_image(sample_png(), "cmyk")


# ---------------------------------------------------------------- npy


def npy_bytes(arr, version=None):
    buf = io.BytesIO()
    if version is None:
        np.save(buf, arr)
    else:
        np.lib.format.write_array(buf, arr, version=version)
    return buf.getvalue()


def npy_arrays():
    rng = np.random.default_rng(0)
    cases = {}
    for code in [
        "?",
        "u1",
        "i1",
        "<u2",
        "<i2",
        "<u4",
        "<i4",
        "<u8",
        "<i8",
        "<f2",
        "<f4",
        "<f8",
        ">u2",
        ">i2",
        ">u4",
        ">i4",
        ">u8",
        ">i8",
        ">f2",
        ">f4",
        ">f8",
    ]:
        dt = np.dtype(code)
        if dt.kind == "f":
            arr = rng.normal(0, 100, (5, 7)).astype(dt)
            arr[0, 0] = np.nan
            arr[0, 1] = -np.inf
        elif dt.kind == "b":
            arr = rng.integers(0, 2, (5, 7)).astype(dt)
        else:
            info = np.iinfo(dt)
            arr = rng.integers(info.min, info.max, (5, 7), dtype=dt.newbyteorder("="))
            arr = arr.astype(dt)
        cases[f"{code}-2d"] = arr
        cases[f"{code}-fortran"] = np.asfortranarray(arr)
    base = rng.normal(size=(3, 4, 5, 2)).astype(np.float32)
    cases["fortran-3d"] = np.asfortranarray(base[..., 0])
    cases["fortran-4d"] = np.asfortranarray(base)
    cases["fortran-4d-big"] = np.asfortranarray(base.astype(">f8"))
    cases["fortran-unit-axes"] = np.asfortranarray(base[:1, :, :1, :])
    cases["0d"] = np.array(3.5)
    cases["0d-int-big"] = np.array(-7, dtype=">i8")
    cases["empty-1d"] = np.zeros((0,), np.int32)
    cases["empty-3d"] = np.zeros((3, 0, 2), np.float64)
    cases["empty-fortran"] = np.asfortranarray(np.zeros((4, 0), np.uint16))
    cases["1d"] = np.arange(100, dtype=np.int64)
    cases["big-shape-1"] = np.arange(6, dtype=np.uint8).reshape(1, 1, 6)
    return cases


NPY_ARRAYS = npy_arrays()


@pytest.mark.parametrize("version", [None, (1, 0), (2, 0), (3, 0)])
@pytest.mark.parametrize("name", sorted(NPY_ARRAYS))
def test_npy_matches_numpy(name, version):
    data = npy_bytes(NPY_ARRAYS[name], version)
    expected = np.load(io.BytesIO(data))
    got = _core.decode_npy(data)
    assert got.dtype == expected.dtype.newbyteorder("=")
    assert got.dtype.isnative
    assert got.shape == expected.shape
    assert got.flags.c_contiguous
    assert np.array_equal(got, expected, equal_nan=got.dtype.kind == "f")


def make_npy(header, payload=b"", version=1, magic=b"\x93NUMPY"):
    text = header.encode("utf8")
    if version == 1:
        prefix = magic + bytes([1, 0]) + struct.pack("<H", len(text))
    else:
        prefix = magic + bytes([version, 0]) + struct.pack("<I", len(text))
    return prefix + text + payload


@pytest.mark.parametrize(
    "header",
    [
        "{'descr': '<i4', 'fortran_order': False, 'shape': (2, 3), }",
        "{'shape': (2, 3), 'descr': '<i4', 'fortran_order': False}",
        '{"fortran_order": False, "shape": (2,3,), "descr": "<i4"}   \n',
        "{'descr':'<i4','fortran_order':False,'shape':(2, 3)}\n",
    ],
)
def test_npy_header_forms(header):
    payload = np.arange(6, dtype="<i4").tobytes()
    for version in (1, 2, 3):
        got = _core.decode_npy(make_npy(header, payload, version))
        assert got.tolist() == [[0, 1, 2], [3, 4, 5]]


GOOD_HEADER = "{'descr': '<i4', 'fortran_order': False, 'shape': (2,), }\n"
BAD_NPY = {
    "bad-magic": make_npy(GOOD_HEADER, b"\x00" * 8, magic=b"\x93NUMPZ"),
    "not-npy": b"PK\x03\x04 zip file",
    "short": b"\x93NUM",
    "version-4": make_npy(GOOD_HEADER, b"\x00" * 8, version=4),
    "header-past-end": make_npy(GOOD_HEADER)[:20],
    "not-a-dict": make_npy("['<i4', False, (2,)]", b"\x00" * 8),
    "missing-key": make_npy("{'descr': '<i4', 'shape': (2,)}", b"\x00" * 8),
    "extra-key": make_npy(
        "{'descr': '<i4', 'fortran_order': False, 'shape': (2,), 'x': 1}", b"\x00" * 8
    ),
    "duplicate-key": make_npy(
        "{'descr': '<i4', 'descr': '<i4', 'fortran_order': False, 'shape': (2,)}", b"\x00" * 8
    ),
    "shape-not-tuple": make_npy(
        "{'descr': '<i4', 'fortran_order': False, 'shape': (2)}", b"\x00" * 8
    ),
    "negative-shape": make_npy(
        "{'descr': '<i4', 'fortran_order': False, 'shape': (-2,)}", b"\x00" * 8
    ),
    "bad-bool": make_npy("{'descr': '<i4', 'fortran_order': 0, 'shape': (2,)}", b"\x00" * 8),
    "trailing-junk": make_npy(GOOD_HEADER.strip() + " x", b"\x00" * 8),
    "object": npy_bytes(np.array([1, "a"], dtype=object)),
    # (strings, complex and records are read: see test_npy_dtypes.py)
    "object-in-record": npy_bytes(np.array([(1, "a")], dtype=[("a", "<i4"), ("b", "O")])),
    "unknown-type": make_npy(
        "{'descr': '<x4', 'fortran_order': False, 'shape': (2,)}", b"\x00" * 8
    ),
    "bad-time-unit": make_npy(
        "{'descr': '<M8[zz]', 'fortran_order': False, 'shape': (1,)}", b"\x00" * 8
    ),
    "zero-size": make_npy("{'descr': [], 'fortran_order': False, 'shape': (1,)}", b""),
    "bad-record": make_npy(
        "{'descr': [('a' '<i4')], 'fortran_order': False, 'shape': (1,)}", b"\x00" * 4
    ),
    "shape-overflow": make_npy(
        "{'descr': '<f8', 'fortran_order': False, "
        "'shape': (1099511627776, 1099511627776, 1099511627776)}"
    ),
    "bytes-overflow": make_npy(
        "{'descr': '<f8', 'fortran_order': False, 'shape': (4611686018427387904,)}"
    ),
    "entry-overflow": make_npy(
        "{'descr': '<f8', 'fortran_order': False, 'shape': (99999999999999999999,)}"
    ),
    "short-payload": npy_bytes(np.arange(10, dtype=np.int64))[:-1],
    "no-payload": make_npy(GOOD_HEADER),
}


@pytest.mark.parametrize("name", sorted(BAD_NPY))
def test_bad_npy_raises(name):
    message = assert_data_error(_core.decode_npy, BAD_NPY[name])
    if name.startswith("object"):
        assert "object" in message and "allow_pickle" in message


# ---------------------------------------------------------------- labels

GOOD_LABELS = [
    b"3",
    b" 3\n",
    b"-12",
    b"+7",
    b"1_000",
    b"0_0",
    b"007",
    b"\t\x0b\x0c42\r\n ",
    b"9223372036854775807",
    b"-9223372036854775808",
    b"-0",
    b"1_2_3",
]
BAD_LABELS = [
    b"abc",
    b"",
    b"   ",
    b"1__0",
    b"_1",
    b"1_",
    b"- 1",
    b"+",
    b"-",
    b"1.5",
    b"0x10",
    b"1 2",
    b"\xd9\xa1",
    b"3\x00",
    b"+_1",
    b"9223372036854775808",
    b"-9223372036854775809",
    b"1" * 40,
]


@pytest.mark.parametrize("data", GOOD_LABELS)
def test_label_matches_python_int(data):
    assert _core.parse_int_label(data) == int(data)


@pytest.mark.parametrize("data", BAD_LABELS)
def test_bad_label_raises(data):
    try:
        value = int(data)
    except ValueError:
        pass  # Python refuses it too
    else:
        assert not -(2**63) <= value < 2**63  # only the int64 range differs
    assert_data_error(_core.parse_int_label, data)


# ---------------------------------------------------------------- transforms


@pytest.mark.parametrize("channels", [1, 3])
@pytest.mark.parametrize(
    "src,dst",
    [
        ((64, 64), (32, 32)),
        ((50, 37), (13, 29)),
        ((7, 9), (40, 30)),
        ((100, 3), (5, 5)),
        ((1, 1), (4, 4)),
    ],
)
@pytest.mark.parametrize("crop", ["none", "center"])
def test_resize_constant_stays_constant(channels, src, dst, crop):
    shape = src if channels == 1 else (*src, channels)
    img = np.full(shape, 173, np.uint8)
    out = chute_testing.transform_image(img, dst[0], dst[1], crop=crop)
    assert out.shape == (dst if channels == 1 else (*dst, channels))
    assert (out == 173).all()


def test_downscale_checkerboard_is_mid_gray():
    board = ((np.indices((64, 64)).sum(0) % 2) * 255).astype(np.uint8)
    out = chute_testing.transform_image(board, 32, 32, crop="none").astype(np.float64)
    # Interior pixels average two light and two dark input pixels per axis.
    # The border pixels lose the filter tap that falls outside the image (the
    # weights are renormalized, as Pillow does), so they are checked looser.
    assert np.abs(out[1:-1, 1:-1] - 127.5).max() <= 1
    assert np.abs(out - 127.5).max() <= 40
    assert abs(out.mean() - 127.5) < 4


def test_resize_gradient_is_monotonic():
    ramp = np.tile(np.arange(0, 256, 4, dtype=np.uint8), (8, 1))
    for width in (16, 100):
        out = chute_testing.transform_image(ramp, 8, width, crop="none").astype(int)
        assert (np.diff(out, axis=1) >= 0).all()


def test_crop_flip_layout_and_float():
    img = noise(10, 12, 3, seed=9)
    # 10x12 to 10x10 covers without resizing, then a center crop.
    out = chute_testing.transform_image(img, 10, 10, crop="center")
    assert np.array_equal(out, img[:, 1:11])
    out = chute_testing.transform_image(img, 10, 10, crop="center", flip=True)
    assert np.array_equal(out, img[:, 1:11][:, ::-1])
    out = chute_testing.transform_image(img, 0, 0, crop="none", chw=True)
    assert np.array_equal(out, img.transpose(2, 0, 1))
    out = chute_testing.transform_image(img, 0, 0, crop="none", flip=True, chw=True, to_float=True)
    expected = img[:, ::-1].transpose(2, 0, 1).astype("f") / 255.0  # webdataset's formula
    assert out.dtype == np.float32
    assert np.array_equal(out.view(np.uint32), np.ascontiguousarray(expected).view(np.uint32))
    every = np.arange(256, dtype=np.uint8).reshape(16, 16)
    got = chute_testing.transform_image(every, 0, 0, crop="none", to_float=True)
    assert np.array_equal(got.view(np.uint32), (every.astype("f") / 255.0).view(np.uint32))


@pytest.mark.parametrize("width", [1, 15, 16, 17, 31, 32, 33, 47, 48, 63, 64, 65, 95, 96, 97, 257])
def test_chw_split_every_width(width):
    # The plane split runs 32, then 16 pixels at a time, then one by one:
    # widths around those steps exercise every tail.
    img = noise(3, width, 3, seed=width)
    out = chute_testing.transform_image(img, 0, 0, crop="none", chw=True)
    assert np.array_equal(out, img.transpose(2, 0, 1))


def test_center_crop_after_cover_resize():
    img = np.full((40, 80, 3), 9, np.uint8)
    out = chute_testing.transform_image(img, 20, 20, crop="center")
    assert out.shape == (20, 20, 3)
    assert (out == 9).all()
