//! The tray icon, drawn rather than loaded: three nodes joined by links, in the colour of the tray's look
//! (grey alone, blue in a cluster, green serving, amber degraded). On macOS the menu bar wants a template
//! image (black with alpha, tinted by the system), so the shape carries the state there: alone is one
//! node, a cluster three, serving adds a filled centre, degraded leaves one node hollow.

use super::TrayLook;

/// RGBA pixels of a `size`×`size` icon.
pub fn tray_icon(look: TrayLook, size: u32, template: bool) -> Vec<u8> {
    let colour = if template {
        [0, 0, 0]
    } else {
        match look {
            TrayLook::Alone => [0x8a, 0x8f, 0x98],
            TrayLook::Cluster => [0x3b, 0x82, 0xf6],
            TrayLook::Serving => [0x22, 0xc5, 0x5e],
            TrayLook::Degraded => [0xf5, 0x9e, 0x0b],
        }
    };
    let s = size as f32;
    let nodes = [(0.5 * s, 0.2 * s), (0.2 * s, 0.75 * s), (0.8 * s, 0.75 * s)];
    let radius = 0.14 * s;
    let line = 0.06 * s;
    let mut canvas = Canvas { size, pixels: vec![0; (size * size * 4) as usize] };
    if look == TrayLook::Alone {
        canvas.disc((0.5 * s, 0.5 * s), 0.22 * s, colour);
        return canvas.pixels;
    }
    for (i, a) in nodes.iter().enumerate() {
        let b = nodes[(i + 1) % nodes.len()];
        canvas.segment(*a, b, line, colour);
    }
    for (i, centre) in nodes.iter().enumerate() {
        canvas.disc(*centre, radius, colour);
        if look == TrayLook::Degraded && i == 0 {
            canvas.clear_disc(*centre, radius * 0.55);
        }
    }
    if look == TrayLook::Serving {
        canvas.disc((0.5 * s, 0.57 * s), 0.1 * s, colour);
    }
    canvas.pixels
}

struct Canvas {
    size: u32,
    pixels: Vec<u8>,
}

impl Canvas {
    /// Paints every pixel whose centre lies within `distance` of the shape, with a one-pixel soft edge.
    fn paint(&mut self, colour: [u8; 3], distance: impl Fn(f32, f32) -> f32) {
        for y in 0..self.size {
            for x in 0..self.size {
                let d = distance(x as f32 + 0.5, y as f32 + 0.5);
                let coverage = (0.5 - d).clamp(0.0, 1.0);
                if coverage <= 0.0 {
                    continue;
                }
                let i = ((y * self.size + x) * 4) as usize;
                let alpha = (coverage * 255.0) as u8;
                if alpha >= self.pixels[i + 3] {
                    self.pixels[i..i + 3].copy_from_slice(&colour);
                    self.pixels[i + 3] = alpha;
                }
            }
        }
    }

    fn disc(&mut self, (cx, cy): (f32, f32), r: f32, colour: [u8; 3]) {
        self.paint(colour, |x, y| ((x - cx).powi(2) + (y - cy).powi(2)).sqrt() - r);
    }

    fn clear_disc(&mut self, (cx, cy): (f32, f32), r: f32) {
        for y in 0..self.size {
            for x in 0..self.size {
                let d = ((x as f32 + 0.5 - cx).powi(2) + (y as f32 + 0.5 - cy).powi(2)).sqrt();
                if d < r {
                    let i = ((y * self.size + x) * 4) as usize;
                    self.pixels[i..i + 4].fill(0);
                }
            }
        }
    }

    fn segment(&mut self, (ax, ay): (f32, f32), (bx, by): (f32, f32), width: f32, colour: [u8; 3]) {
        self.paint(colour, |x, y| {
            let (dx, dy) = (bx - ax, by - ay);
            let t = (((x - ax) * dx + (y - ay) * dy) / (dx * dx + dy * dy)).clamp(0.0, 1.0);
            ((x - ax - t * dx).powi(2) + (y - ay - t * dy).powi(2)).sqrt() - width / 2.0
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pixel(icon: &[u8], size: u32, x: u32, y: u32) -> [u8; 4] {
        let i = ((y * size + x) * 4) as usize;
        icon[i..i + 4].try_into().unwrap()
    }

    /// The colour family a pixel reads as, from its channels (not from the palette above).
    fn family([r, g, b, a]: [u8; 4]) -> &'static str {
        let (r, g, b) = (r as i32, g as i32, b as i32);
        match () {
            _ if a == 0 => "transparent",
            _ if (r - g).abs() < 24 && (g - b).abs() < 24 => "grey",
            _ if b > r + 60 && b > g + 30 => "blue",
            _ if g > r + 60 && g > b + 30 => "green",
            _ if r > b + 120 && g > b + 60 && r >= g => "amber",
            _ => "other",
        }
    }

    #[test]
    fn each_look_reads_as_its_colour_on_a_transparent_background() {
        let size = 32;
        // The bottom-left node's centre (the top one is hollow when degraded), and a corner.
        let (node, corner) = ((6, 24), (0, 0));
        for (look, colour) in [
            (TrayLook::Alone, "grey"),
            (TrayLook::Cluster, "blue"),
            (TrayLook::Serving, "green"),
            (TrayLook::Degraded, "amber"),
        ] {
            let icon = tray_icon(look, size, false);
            assert_eq!(icon.len(), 32 * 32 * 4);
            // Alone is one node in the middle.
            let (x, y) = if look == TrayLook::Alone { (16, 16) } else { node };
            assert_eq!(family(pixel(&icon, size, x, y)), colour, "{look:?}");
            assert_eq!(pixel(&icon, size, x, y)[3], 255, "{look:?} is opaque where it is drawn");
            assert_eq!(family(pixel(&icon, size, corner.0, corner.1)), "transparent", "{look:?}");
        }
    }

    #[test]
    fn template_icons_tell_the_states_apart_by_shape() {
        let looks = [TrayLook::Alone, TrayLook::Cluster, TrayLook::Serving, TrayLook::Degraded];
        let icons: Vec<_> = looks.iter().map(|l| tray_icon(*l, 32, true)).collect();
        for (i, a) in icons.iter().enumerate() {
            assert!(a.chunks(4).all(|p| p[..3] == [0, 0, 0]), "template pixels are black");
            for b in &icons[i + 1..] {
                assert_ne!(a, b);
            }
        }
        assert_eq!(pixel(&icons[3], 32, 16, 6)[3], 0, "degraded: the top node is hollow");
    }
}
