//! Server-sent events, as both vendors stream answers (pure): bytes in, each event's name and
//! data out. Bounded: a line longer than [`MAX_LINE_BYTES`] is an error, never a growing buffer.

/// The longest line of a stream we hold (an event's data is one JSON object of a few tokens).
pub const MAX_LINE_BYTES: usize = 1 << 20;

/// One event: its `event:` name (empty when none) and its `data:` lines joined.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Event {
    pub name: String,
    pub data: String,
}

/// Reads events from a stream's chunks as they come.
#[derive(Default)]
pub struct EventReader {
    line: Vec<u8>,
    event: Event,
    has_data: bool,
}

/// A line past [`MAX_LINE_BYTES`].
#[derive(Debug, PartialEq, Eq)]
pub struct LineTooLong;

impl EventReader {
    /// The events that `chunk` completes.
    pub fn feed(&mut self, chunk: &[u8]) -> Result<Vec<Event>, LineTooLong> {
        let mut events = Vec::new();
        for &byte in chunk {
            if byte != b'\n' {
                if self.line.len() >= MAX_LINE_BYTES {
                    return Err(LineTooLong);
                }
                self.line.push(byte);
                continue;
            }
            let raw = std::mem::take(&mut self.line);
            let line = String::from_utf8_lossy(&raw);
            let line = line.strip_suffix('\r').unwrap_or(&line);
            if line.is_empty() {
                if self.has_data || !self.event.name.is_empty() {
                    events.push(std::mem::take(&mut self.event));
                }
                self.has_data = false;
                continue;
            }
            let (field, value) = line.split_once(':').unwrap_or((line, ""));
            let value = value.strip_prefix(' ').unwrap_or(value);
            match field {
                "event" => self.event.name = value.to_string(),
                "data" => {
                    if self.has_data {
                        self.event.data.push('\n');
                    }
                    if self.event.data.len() + value.len() > MAX_LINE_BYTES {
                        return Err(LineTooLong);
                    }
                    self.event.data.push_str(value);
                    self.has_data = true;
                }
                // Comments (`: ping`), ids and retry hints mean nothing to us.
                _ => {}
            }
        }
        Ok(events)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn events_are_read_across_chunks_and_line_endings() {
        let stream =
            "event: message_start\r\ndata: {\"a\":1}\r\n\r\n: comment\n\ndata: one\ndata: two\n\ndata: [DONE]\n\n";
        let mut reader = EventReader::default();
        let mut events = Vec::new();
        for chunk in stream.as_bytes().chunks(3) {
            events.extend(reader.feed(chunk).unwrap());
        }
        assert_eq!(
            events,
            vec![
                Event { name: "message_start".into(), data: "{\"a\":1}".into() },
                Event { name: String::new(), data: "one\ntwo".into() },
                Event { name: String::new(), data: "[DONE]".into() },
            ]
        );
    }

    #[test]
    fn an_endless_line_is_refused_not_held() {
        let mut reader = EventReader::default();
        let mb = vec![b'x'; 256 * 1024];
        let mut refused = false;
        for _ in 0..8 {
            if reader.feed(&mb).is_err() {
                refused = true;
                break;
            }
        }
        assert!(refused);
        assert!(reader.line.len() <= MAX_LINE_BYTES);
    }

    proptest! {
        #[test]
        fn any_bytes_in_any_chunks_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..2000), cut in 1usize..64) {
            let mut reader = EventReader::default();
            for chunk in bytes.chunks(cut) {
                let _ = reader.feed(chunk);
            }
        }
    }
}
