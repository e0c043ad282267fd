//! SPDY/3.1 framing, as much of it as the API server's streaming leg to a
//! kubelet uses (`kubectl exec`): frames decoded from and encoded to bytes,
//! with the zlib-compressed header blocks (one compression context per
//! direction for the whole connection, primed with the protocol's
//! dictionary). Pure: no IO; the session in [`super::exec`] drives it.
//! Flow control (WINDOW_UPDATE) is read and ignored, as the API server's
//! side (spdystream) does not enforce it either.

use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};

include!("spdy_dictionary.rs");

/// The protocol's header dictionary, as bytes.
pub fn dictionary() -> Vec<u8> {
    let mut out = Vec::with_capacity(1500);
    for word in DICTIONARY_WORDS {
        out.extend_from_slice(&u32::try_from(word.len()).unwrap_or(0).to_be_bytes());
        out.extend_from_slice(word.as_bytes());
    }
    out.extend_from_slice(DICTIONARY_TAIL.as_bytes());
    out
}

const VERSION: u16 = 3;
const SYN_STREAM: u16 = 1;
const SYN_REPLY: u16 = 2;
const RST_STREAM: u16 = 3;
const PING: u16 = 6;
const GOAWAY: u16 = 7;
const HEADERS: u16 = 8;
const FLAG_FIN: u8 = 0x01;
/// Larger frames are refused: nothing on an exec leg comes near.
const MAX_FRAME: usize = 1 << 20;
/// Header blocks larger than this once inflated are refused.
const MAX_HEADERS: usize = 1 << 20;

/// Why bytes are not SPDY/3.1.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SpdyError {
    #[error("a SPDY frame is malformed: {0}")]
    Malformed(&'static str),
    #[error("SPDY version {0} is not supported")]
    Version(u16),
    #[error("a SPDY header block cannot be decompressed")]
    Inflate,
    #[error("a SPDY header block cannot be compressed")]
    Deflate,
}

pub type Headers = Vec<(String, String)>;

/// A frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    Data {
        stream: u32,
        fin: bool,
        data: Vec<u8>,
    },
    SynStream {
        stream: u32,
        fin: bool,
        headers: Headers,
    },
    SynReply {
        stream: u32,
        fin: bool,
        headers: Headers,
    },
    RstStream {
        stream: u32,
        status: u32,
    },
    Ping {
        id: u32,
    },
    GoAway {
        last_stream: u32,
        status: u32,
    },
    /// SETTINGS, HEADERS, WINDOW_UPDATE and anything else: read, ignored.
    Other {
        kind: u16,
    },
}

fn u32_at(b: &[u8], at: usize) -> Result<u32, SpdyError> {
    b.get(at..at + 4)
        .and_then(|s| s.try_into().ok())
        .map(u32::from_be_bytes)
        .ok_or(SpdyError::Malformed("too short"))
}

/// The reading side: frames from bytes, header blocks inflated.
#[allow(missing_debug_implementations)] // flate2's state is not Debug.
pub struct Decoder {
    inflate: Decompress,
    dictionary: Vec<u8>,
}

impl Default for Decoder {
    fn default() -> Self {
        Self {
            inflate: Decompress::new(true),
            dictionary: dictionary(),
        }
    }
}

impl Decoder {
    /// One frame from the start of `buf`, and how many bytes it took;
    /// `None` while `buf` does not hold a whole frame yet.
    pub fn decode(&mut self, buf: &[u8]) -> Result<Option<(Frame, usize)>, SpdyError> {
        if buf.len() < 8 {
            return Ok(None);
        }
        let first = u32_at(buf, 0)?;
        let second = u32_at(buf, 4)?;
        let flags = (second >> 24) as u8;
        let len = (second & 0x00ff_ffff) as usize;
        if len > MAX_FRAME {
            return Err(SpdyError::Malformed("frame too large"));
        }
        if buf.len() < 8 + len {
            return Ok(None);
        }
        let payload = &buf[8..8 + len];
        let fin = flags & FLAG_FIN != 0;
        if first & 0x8000_0000 == 0 {
            let frame = Frame::Data {
                stream: first & 0x7fff_ffff,
                fin,
                data: payload.to_vec(),
            };
            return Ok(Some((frame, 8 + len)));
        }
        let version = ((first >> 16) & 0x7fff) as u16;
        if version != VERSION {
            return Err(SpdyError::Version(version));
        }
        let kind = (first & 0xffff) as u16;
        let frame = match kind {
            SYN_STREAM => Frame::SynStream {
                stream: u32_at(payload, 0)? & 0x7fff_ffff,
                fin,
                headers: self.headers(
                    payload
                        .get(10..)
                        .ok_or(SpdyError::Malformed("short SYN_STREAM"))?,
                )?,
            },
            SYN_REPLY => Frame::SynReply {
                stream: u32_at(payload, 0)? & 0x7fff_ffff,
                fin,
                headers: self.headers(
                    payload
                        .get(4..)
                        .ok_or(SpdyError::Malformed("short SYN_REPLY"))?,
                )?,
            },
            HEADERS => {
                // Ignored, but inflated: the context spans the connection.
                self.headers(
                    payload
                        .get(4..)
                        .ok_or(SpdyError::Malformed("short HEADERS"))?,
                )?;
                Frame::Other { kind }
            }
            RST_STREAM => Frame::RstStream {
                stream: u32_at(payload, 0)? & 0x7fff_ffff,
                status: u32_at(payload, 4)?,
            },
            PING => Frame::Ping {
                id: u32_at(payload, 0)?,
            },
            GOAWAY => Frame::GoAway {
                last_stream: u32_at(payload, 0)? & 0x7fff_ffff,
                status: u32_at(payload, 4).unwrap_or(0),
            },
            _ => Frame::Other { kind },
        };
        Ok(Some((frame, 8 + len)))
    }

    fn headers(&mut self, block: &[u8]) -> Result<Headers, SpdyError> {
        let raw = self.inflate(block)?;
        parse_headers(&raw)
    }

    fn inflate(&mut self, input: &[u8]) -> Result<Vec<u8>, SpdyError> {
        let mut out = Vec::with_capacity(input.len() * 4 + 64);
        let mut pos = 0;
        // Bounded: each turn consumes input, produces output or sets the
        // dictionary once.
        for _ in 0..10_000 {
            if out.len() == out.capacity() {
                out.reserve(out.capacity().max(256));
            }
            let (in_before, out_before) = (self.inflate.total_in(), self.inflate.total_out());
            let result =
                self.inflate
                    .decompress_vec(&input[pos..], &mut out, FlushDecompress::Sync);
            let used = usize::try_from(self.inflate.total_in() - in_before)
                .map_err(|_| SpdyError::Inflate)?;
            pos += used;
            let produced = self.inflate.total_out() != out_before;
            match result {
                Ok(Status::StreamEnd) => return Err(SpdyError::Inflate),
                Ok(_) => {
                    if pos >= input.len() && out.len() < out.capacity() {
                        return Ok(out);
                    }
                    if used == 0 && !produced && out.len() < out.capacity() {
                        return Err(SpdyError::Inflate);
                    }
                }
                Err(e) if e.needs_dictionary().is_some() => {
                    self.inflate
                        .set_dictionary(&self.dictionary)
                        .map_err(|_| SpdyError::Inflate)?;
                }
                Err(_) => return Err(SpdyError::Inflate),
            }
            if out.len() > MAX_HEADERS {
                return Err(SpdyError::Malformed("header block too large"));
            }
        }
        Err(SpdyError::Inflate)
    }
}

/// A header block's pairs (names as sent, lower-case in SPDY/3).
pub fn parse_headers(raw: &[u8]) -> Result<Headers, SpdyError> {
    let count = u32_at(raw, 0)? as usize;
    let mut at = 4;
    let mut out = Vec::new();
    let take = |at: &mut usize| -> Result<String, SpdyError> {
        let len = u32_at(raw, *at)? as usize;
        let s = raw
            .get(*at + 4..*at + 4 + len)
            .ok_or(SpdyError::Malformed("header runs past the block"))?;
        *at += 4 + len;
        Ok(String::from_utf8_lossy(s).into_owned())
    };
    for _ in 0..count.min(10_000) {
        let name = take(&mut at)?;
        let value = take(&mut at)?;
        out.push((name, value));
    }
    Ok(out)
}

pub fn header_block(headers: &[(String, String)]) -> Vec<u8> {
    let mut out = Vec::new();
    let len = |n: usize| u32::try_from(n).unwrap_or(u32::MAX).to_be_bytes();
    out.extend_from_slice(&len(headers.len()));
    for (name, value) in headers {
        out.extend_from_slice(&len(name.len()));
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(&len(value.len()));
        out.extend_from_slice(value.as_bytes());
    }
    out
}

/// The writing side: frames to bytes, header blocks deflated.
#[allow(missing_debug_implementations)]
pub struct Encoder {
    deflate: Compress,
}

impl Encoder {
    pub fn new() -> Result<Self, SpdyError> {
        let mut deflate = Compress::new(Compression::default(), true);
        deflate
            .set_dictionary(&dictionary())
            .map_err(|_| SpdyError::Deflate)?;
        Ok(Self { deflate })
    }

    pub fn encode(&mut self, frame: &Frame) -> Result<Vec<u8>, SpdyError> {
        let control = |kind: u16, flags: u8, payload: Vec<u8>| -> Vec<u8> {
            let mut out = Vec::with_capacity(8 + payload.len());
            out.extend_from_slice(&(0x8000_u16 | VERSION).to_be_bytes());
            out.extend_from_slice(&kind.to_be_bytes());
            let len = u32::try_from(payload.len()).unwrap_or(0) & 0x00ff_ffff;
            out.extend_from_slice(&((u32::from(flags) << 24) | len).to_be_bytes());
            out.extend_from_slice(&payload);
            out
        };
        let fin_flag = |fin: bool| if fin { FLAG_FIN } else { 0 };
        Ok(match frame {
            Frame::Data { stream, fin, data } => {
                if data.len() > 0x00ff_ffff {
                    return Err(SpdyError::Malformed("data frame too large"));
                }
                let mut out = Vec::with_capacity(8 + data.len());
                out.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
                let len = u32::try_from(data.len()).unwrap_or(0);
                out.extend_from_slice(&((u32::from(fin_flag(*fin)) << 24) | len).to_be_bytes());
                out.extend_from_slice(data);
                out
            }
            Frame::SynStream {
                stream,
                fin,
                headers,
            } => {
                let mut payload = (stream & 0x7fff_ffff).to_be_bytes().to_vec();
                payload.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
                payload.extend(self.deflate(&header_block(headers))?);
                control(SYN_STREAM, fin_flag(*fin), payload)
            }
            Frame::SynReply {
                stream,
                fin,
                headers,
            } => {
                let mut payload = (stream & 0x7fff_ffff).to_be_bytes().to_vec();
                payload.extend(self.deflate(&header_block(headers))?);
                control(SYN_REPLY, fin_flag(*fin), payload)
            }
            Frame::RstStream { stream, status } => {
                let mut payload = (stream & 0x7fff_ffff).to_be_bytes().to_vec();
                payload.extend_from_slice(&status.to_be_bytes());
                control(RST_STREAM, 0, payload)
            }
            Frame::Ping { id } => control(PING, 0, id.to_be_bytes().to_vec()),
            Frame::GoAway {
                last_stream,
                status,
            } => {
                let mut payload = (last_stream & 0x7fff_ffff).to_be_bytes().to_vec();
                payload.extend_from_slice(&status.to_be_bytes());
                control(GOAWAY, 0, payload)
            }
            Frame::Other { .. } => return Err(SpdyError::Malformed("cannot encode this frame")),
        })
    }

    fn deflate(&mut self, input: &[u8]) -> Result<Vec<u8>, SpdyError> {
        let mut out = Vec::with_capacity(input.len() + 64);
        let mut pos = 0;
        for _ in 0..10_000 {
            if out.len() == out.capacity() {
                out.reserve(out.capacity().max(256));
            }
            let before = self.deflate.total_in();
            self.deflate
                .compress_vec(&input[pos..], &mut out, FlushCompress::Sync)
                .map_err(|_| SpdyError::Deflate)?;
            pos += usize::try_from(self.deflate.total_in() - before)
                .map_err(|_| SpdyError::Deflate)?;
            if pos >= input.len() && out.len() < out.capacity() {
                return Ok(out);
            }
        }
        Err(SpdyError::Deflate)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn adler32(data: &[u8]) -> u32 {
        let (mut a, mut b) = (1u32, 0u32);
        for &byte in data {
            a = (a + u32::from(byte)) % 65521;
            b = (b + a) % 65521;
        }
        (b << 16) | a
    }

    #[test]
    fn the_dictionary_is_the_protocols() {
        let d = dictionary();
        assert_eq!(d.len(), 1423);
        // The dictionary ID both ends check.
        assert_eq!(adler32(&d), 0xe3c6_a7c2);
    }

    fn h(pairs: &[(&str, &str)]) -> Headers {
        pairs
            .iter()
            .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn frames_round_trip_with_one_context_per_direction() -> Result<(), SpdyError> {
        let mut enc = Encoder::new()?;
        let mut dec = Decoder::default();
        let frames = [
            Frame::SynStream {
                stream: 1,
                fin: false,
                headers: h(&[("streamtype", "error")]),
            },
            Frame::SynStream {
                stream: 3,
                fin: true,
                headers: h(&[("streamtype", "stdout"), ("x", "")]),
            },
            Frame::SynReply {
                stream: 3,
                fin: false,
                headers: Vec::new(),
            },
            Frame::Data {
                stream: 3,
                fin: true,
                data: b"hello".to_vec(),
            },
            Frame::Ping { id: 7 },
            Frame::RstStream {
                stream: 5,
                status: 5,
            },
            Frame::GoAway {
                last_stream: 3,
                status: 0,
            },
        ];
        // All in one buffer, cut anywhere: a frame is decoded only whole.
        let bytes: Vec<u8> = frames
            .iter()
            .map(|f| enc.encode(f))
            .collect::<Result<Vec<_>, _>>()?
            .concat();
        let mut got = Vec::new();
        let mut buf = Vec::new();
        for chunk in bytes.chunks(5) {
            buf.extend_from_slice(chunk);
            while let Some((frame, used)) = dec.decode(&buf)? {
                buf.drain(..used);
                got.push(frame);
            }
        }
        assert!(buf.is_empty());
        assert_eq!(got, frames);
        Ok(())
    }

    #[test]
    fn bad_input_is_refused() {
        let mut dec = Decoder::default();
        // Version 2.
        let v2 = [0x80, 0x02, 0x00, 0x06, 0, 0, 0, 4, 0, 0, 0, 1];
        assert_eq!(dec.decode(&v2), Err(SpdyError::Version(2)));
        // A SYN_STREAM whose header block is not zlib.
        let mut dec = Decoder::default();
        let junk = [
            0x80, 0x03, 0x00, 0x01, 0, 0, 0, 14, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4,
        ];
        assert_eq!(dec.decode(&junk), Err(SpdyError::Inflate));
        // Incomplete frames wait for more.
        assert_eq!(Decoder::default().decode(&v2[..6]), Ok(None));
        assert!(parse_headers(&[0, 0, 0, 1, 0, 0, 0, 9, b'a']).is_err());
    }
}
