//! Photos and scans of pages (PNG, JPEG, TIFF): their size read from their headers alone, so
//! a decompression bomb (a few KB claiming 100,000 × 100,000 pixels, or a TIFF of a million
//! frames, or one whose frames point at each other) is refused before a pixel is decoded.
//! Pure and bounded: every loop walks a byte slice forward or counts frames against a limit.

/// An image's formats and sizes, as its headers claim them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ImageFormat {
    Png,
    Jpeg,
    Tiff,
}

/// What an image's headers say: its format, its largest frame and its frames (pages).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImageSize {
    pub format: ImageFormat,
    pub width: u32,
    pub height: u32,
    pub frames: u32,
}

/// How large an image may be.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ImageBounds {
    /// Pixels in one frame (a page scanned at 300 DPI is about 9 million).
    pub max_pixels: u64,
    /// Either side of a frame.
    pub max_side: u32,
    /// Frames (pages) in one file.
    pub max_frames: u32,
}

impl ImageBounds {
    /// 50 megapixels a frame, 20,000 pixels a side, 100 frames.
    pub const DEFAULT: ImageBounds = ImageBounds { max_pixels: 50_000_000, max_side: 20_000, max_frames: 100 };
}

const PNG_SIGNATURE: &[u8] = b"\x89PNG\r\n\x1a\n";

/// Pure: the image format its first bytes say, if any.
pub fn format_of(head: &[u8]) -> Option<ImageFormat> {
    if head.starts_with(PNG_SIGNATURE) {
        Some(ImageFormat::Png)
    } else if head.starts_with(&[0xFF, 0xD8, 0xFF]) {
        Some(ImageFormat::Jpeg)
    } else if head.starts_with(b"II*\0") || head.starts_with(b"MM\0*") {
        Some(ImageFormat::Tiff)
    } else {
        None
    }
}

/// Pure: the image's size from its headers, within `bounds`; `Err` says in words what is wrong
/// (damaged, or too large and by how much).
pub fn measure(bytes: &[u8], bounds: ImageBounds) -> Result<ImageSize, String> {
    let size = match format_of(bytes) {
        Some(ImageFormat::Png) => png(bytes),
        Some(ImageFormat::Jpeg) => jpeg(bytes),
        Some(ImageFormat::Tiff) => tiff(bytes, bounds),
        None => Err("the file is not a PNG, JPEG or TIFF image".to_string()),
    }?;
    check(size, bounds)?;
    Ok(size)
}

/// Pure: a frame of `width` × `height` within `bounds`.
pub fn check_frame(width: u32, height: u32, bounds: ImageBounds) -> Result<(), String> {
    if width == 0 || height == 0 {
        return Err("the image has no pixels".into());
    }
    let pixels = u64::from(width) * u64::from(height);
    if width > bounds.max_side || height > bounds.max_side || pixels > bounds.max_pixels {
        return Err(format!(
            "the image is {} × {} pixels ({} megapixels); Sluice reads pages of at most {} megapixels and {} pixels a side",
            sluice_types::thousands(width.into()),
            sluice_types::thousands(height.into()),
            pixels.div_ceil(1_000_000),
            bounds.max_pixels / 1_000_000,
            sluice_types::thousands(bounds.max_side.into()),
        ));
    }
    Ok(())
}

fn check(size: ImageSize, bounds: ImageBounds) -> Result<(), String> {
    check_frame(size.width, size.height, bounds)?;
    if size.frames > bounds.max_frames {
        return Err(format!("the image has more than {} pages; split it", bounds.max_frames));
    }
    Ok(())
}

fn damaged(format: &str) -> String {
    format!("the {format} image is damaged (its header cannot be read)")
}

/// PNG: the first chunk is IHDR, width and height big-endian. An animated PNG is read as its
/// first frame, as every OCR engine does.
fn png(bytes: &[u8]) -> Result<ImageSize, String> {
    let header = bytes.get(8..24).ok_or_else(|| damaged("PNG"))?;
    if &header[4..8] != b"IHDR" {
        return Err(damaged("PNG"));
    }
    let width = u32::from_be_bytes(header[8..12].try_into().expect("4 bytes"));
    let height = u32::from_be_bytes(header[12..16].try_into().expect("4 bytes"));
    Ok(ImageSize { format: ImageFormat::Png, width, height, frames: 1 })
}

/// JPEG: walk the marker segments to the first start-of-frame (SOF0–SOF15 but for DHT, JPG and
/// DAC), which holds the height then the width.
fn jpeg(bytes: &[u8]) -> Result<ImageSize, String> {
    let mut at = 2;
    loop {
        // Fill bytes (0xFF runs) may pad between segments.
        while bytes.get(at) == Some(&0xFF) && bytes.get(at + 1) == Some(&0xFF) {
            at += 1;
        }
        let (Some(0xFF), Some(&marker)) = (bytes.get(at), bytes.get(at + 1)) else {
            return Err(damaged("JPEG"));
        };
        if marker == 0xD9 || marker == 0xDA {
            // End of image, or the scan began with no frame header: not a readable JPEG.
            return Err(damaged("JPEG"));
        }
        // Markers without a length: RSTn, SOI, TEM.
        if (0xD0..=0xD8).contains(&marker) || marker == 0x01 {
            at += 2;
            continue;
        }
        let length = bytes.get(at + 2..at + 4).ok_or_else(|| damaged("JPEG"))?;
        let length = usize::from(u16::from_be_bytes([length[0], length[1]]));
        if length < 2 {
            return Err(damaged("JPEG"));
        }
        let is_frame = (0xC0..=0xCF).contains(&marker) && !matches!(marker, 0xC4 | 0xC8 | 0xCC);
        if is_frame {
            let frame = bytes.get(at + 4..at + 9).ok_or_else(|| damaged("JPEG"))?;
            let height = u32::from(u16::from_be_bytes([frame[1], frame[2]]));
            let width = u32::from(u16::from_be_bytes([frame[3], frame[4]]));
            return Ok(ImageSize { format: ImageFormat::Jpeg, width, height, frames: 1 });
        }
        at += 2 + length;
    }
}

/// TIFF: a chain of image file directories (IFDs), one per frame, each naming its width (tag
/// 256) and height (257). The chain is followed at most `max_frames + 1` steps, and an IFD
/// named twice (a loop) is refused.
fn tiff(bytes: &[u8], bounds: ImageBounds) -> Result<ImageSize, String> {
    let max_frames = bounds.max_frames;
    let big_endian = bytes.starts_with(b"MM");
    let u16_at = |at: usize| -> Option<u16> {
        let b = bytes.get(at..at.checked_add(2)?)?;
        Some(if big_endian { u16::from_be_bytes([b[0], b[1]]) } else { u16::from_le_bytes([b[0], b[1]]) })
    };
    let u32_at = |at: usize| -> Option<u32> {
        let b: [u8; 4] = bytes.get(at..at.checked_add(4)?)?.try_into().ok()?;
        Some(if big_endian { u32::from_be_bytes(b) } else { u32::from_le_bytes(b) })
    };
    let mut next = u32_at(4).ok_or_else(|| damaged("TIFF"))? as usize;
    let mut seen = Vec::new();
    let (mut width, mut height, mut frames) = (0u32, 0u32, 0u32);
    while next != 0 {
        if seen.contains(&next) {
            return Err("the TIFF image's pages point back at each other".into());
        }
        if frames > max_frames {
            return Err(format!("the image has more than {max_frames} pages; split it"));
        }
        seen.push(next);
        let entries = u16_at(next).ok_or_else(|| damaged("TIFF"))? as usize;
        let (mut frame_width, mut frame_height) = (None, None);
        for i in 0..entries {
            let entry = next + 2 + 12 * i;
            let tag = u16_at(entry).ok_or_else(|| damaged("TIFF"))?;
            let kind = u16_at(entry + 2).ok_or_else(|| damaged("TIFF"))?;
            // SHORT (3) or LONG (4), one value, in the entry itself.
            let value = match kind {
                3 => u16_at(entry + 8).map(u32::from),
                4 => u32_at(entry + 8),
                _ => None,
            };
            match tag {
                256 => frame_width = value,
                257 => frame_height = value,
                _ => {}
            }
        }
        let (Some(w), Some(h)) = (frame_width, frame_height) else {
            return Err(damaged("TIFF"));
        };
        // Every frame within the bounds, not only the largest.
        check_frame(w, h, bounds)?;
        // Each frame is decoded alone: the largest one bounds the memory.
        if u64::from(w) * u64::from(h) > u64::from(width) * u64::from(height) {
            (width, height) = (w, h);
        }
        frames += 1;
        next = u32_at(next + 2 + 12 * entries).ok_or_else(|| damaged("TIFF"))? as usize;
    }
    if frames == 0 {
        return Err(damaged("TIFF"));
    }
    Ok(ImageSize { format: ImageFormat::Tiff, width, height, frames })
}

#[cfg(any(test, feature = "testing"))]
/// A little-endian TIFF whose frames are `frames` (width, height) and hold no pixels (its
/// headers measure; no decoder reads it), each frame's directory pointing at the next, the last
/// at the first when `looped` (a TIFF whose pages point back at each other).
pub fn tiff_of(frames: &[(u32, u32)], looped: bool) -> Vec<u8> {
    let mut tiff = b"II*\0\x08\0\0\0".to_vec();
    for (i, (width, height)) in frames.iter().enumerate() {
        let here = tiff.len() as u32;
        tiff.extend_from_slice(&2u16.to_le_bytes());
        for (tag, value) in [(256u16, *width), (257, *height)] {
            tiff.extend_from_slice(&tag.to_le_bytes());
            tiff.extend_from_slice(&4u16.to_le_bytes());
            tiff.extend_from_slice(&1u32.to_le_bytes());
            tiff.extend_from_slice(&value.to_le_bytes());
        }
        let next = match i + 1 == frames.len() {
            true if looped => 8,
            true => 0,
            false => here + 30,
        };
        tiff.extend_from_slice(&next.to_le_bytes());
    }
    tiff
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    pub fn png_header(width: u32, height: u32) -> Vec<u8> {
        let mut out = PNG_SIGNATURE.to_vec();
        out.extend_from_slice(&13u32.to_be_bytes());
        out.extend_from_slice(b"IHDR");
        out.extend_from_slice(&width.to_be_bytes());
        out.extend_from_slice(&height.to_be_bytes());
        out.extend_from_slice(&[8, 0, 0, 0, 0, 0, 0, 0, 0]);
        out
    }

    fn jpeg_header(width: u16, height: u16) -> Vec<u8> {
        let mut out = vec![0xFF, 0xD8, 0xFF, 0xE0, 0x00, 0x10];
        out.extend_from_slice(b"JFIF\0\x01\x01\0\0\x01\0\x01\0\0");
        out.extend_from_slice(&[0xFF, 0xC0, 0x00, 0x0B, 8]);
        out.extend_from_slice(&height.to_be_bytes());
        out.extend_from_slice(&width.to_be_bytes());
        out.extend_from_slice(&[1, 1, 0x11, 0]);
        out
    }

    #[test]
    fn sizes_are_read_from_headers_of_each_format() {
        let b = ImageBounds::DEFAULT;
        assert_eq!(measure(&png_header(2480, 3508), b).unwrap().width, 2480);
        let jpeg = measure(&jpeg_header(1700, 2200), b).unwrap();
        assert_eq!((jpeg.format, jpeg.width, jpeg.height), (ImageFormat::Jpeg, 1700, 2200));
        let tiff = measure(&tiff_of(&[(100, 200), (300, 400), (50, 50)], false), b).unwrap();
        assert_eq!((tiff.frames, tiff.width, tiff.height), (3, 300, 400), "its largest frame bounds it");
    }

    #[test]
    fn bombs_and_damaged_headers_are_refused_in_words() {
        let b = ImageBounds::DEFAULT;
        let bomb = measure(&png_header(100_000, 100_000), b).unwrap_err();
        assert!(bomb.contains("100,000 × 100,000") && bomb.contains("megapixels"), "{bomb}");
        assert!(measure(&png_header(20_001, 10), b).is_err(), "a side past its bound");
        assert!(measure(&png_header(0, 10), b).is_err());
        assert!(measure(&jpeg_header(65_000, 65_000), b).is_err());
        // A TIFF whose last frame points back at its first: refused, not walked for ever.
        let looped = measure(&tiff_of(&[(10, 10), (10, 10)], true), b).unwrap_err();
        assert!(looped.contains("point back"), "{looped}");
        let thin = measure(&tiff_of(&[(7_000, 7_000), (1, 48_999_999)], false), b).unwrap_err();
        assert!(thin.contains("48,999,999"), "every frame is bounded, not only the largest: {thin}");
        let many = tiff_of(&vec![(10, 10); 101], false);
        assert!(measure(&many, b).unwrap_err().contains("more than 100 pages"));
        assert!(measure(b"\x89PNG\r\n\x1a\n", b).is_err());
        assert!(measure(&[0xFF, 0xD8, 0xFF, 0xDA, 0, 2], b).is_err());
        assert!(measure(b"II*\0\xff\xff\xff\x7f", b).is_err(), "an IFD past the end");
    }

    proptest! {
        /// Whatever the bytes, measuring answers (no panic, no endless walk) and never passes
        /// an image past its bounds.
        #[test]
        fn any_bytes_are_measured_within_bounds(tail in proptest::collection::vec(any::<u8>(), 0..400), kind in 0usize..3) {
            let head: &[u8] = [&PNG_SIGNATURE[..], &[0xFF, 0xD8, 0xFF][..], &b"II*\0"[..]][kind];
            let bytes = [head, &tail[..]].concat();
            let b = ImageBounds { max_pixels: 1_000_000, max_side: 2_000, max_frames: 5 };
            if let Ok(size) = measure(&bytes, b) {
                prop_assert!(u64::from(size.width) * u64::from(size.height) <= b.max_pixels);
                prop_assert!(size.frames >= 1 && size.frames <= b.max_frames);
            }
        }
    }
}
