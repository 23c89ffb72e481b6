//! Newline-delimited JSON of flat records, decoded in one pass straight into the Arrow
//! builders of the declared columns.
//!
//! arrow-json first writes every value into a tape and then walks the tape once per
//! column; this decoder reads each member once and appends it to its column's builder.
//! The scans for a string's end and the UTF-8 check are SIMD (`memchr`, `simdutf8`), and
//! members are matched to columns by the order the previous record used, so a file whose
//! records all list their members in one order costs one comparison per member.
//!
//! It is a fast path, not a second set of rules: it takes the records arrow-json takes and
//! gives the same batches, or declines ([`FlatJson::decode`] is `None`) and the caller
//! decodes the text with arrow-json as before, which keeps Spark's handling of malformed
//! records, `_corrupt_record` and every accepted timestamp form in one place. It declines
//! whenever the text holds anything it does not treat exactly as arrow-json does: a
//! nested value, a duplicated member, an escaped member name, a number in a string, a
//! fraction for an integer column, a malformed record. Values that arrow-json converts
//! with a library function (floats with `lexical-core`, timestamps with arrow's
//! `string_to_datetime`) are converted with that same function, except where a shorter
//! reading is exact and gives the same value: a short decimal (`short_float`), a
//! timestamp in the common ISO form (`iso_utc`). The differential tests below hold it to
//! that, on fixed cases and on generated JSON.

use std::sync::Arc;

use datafusion::arrow::array::timezone::Tz;
use datafusion::arrow::array::{
    ArrayRef, BooleanBuilder, Date32Builder, Float32Builder, Float64Builder, Int8Builder,
    Int16Builder, Int32Builder, Int64Builder, StringBuilder, TimestampMicrosecondBuilder,
    TimestampMillisecondBuilder, TimestampNanosecondBuilder, TimestampSecondBuilder,
};
use datafusion::arrow::compute::kernels::cast_utils::Parser;
use datafusion::arrow::compute::kernels::cast_utils::string_to_datetime;
use datafusion::arrow::datatypes::{DataType, Date32Type, SchemaRef, TimeUnit};
use datafusion::arrow::record_batch::RecordBatch;

/// Whether the fast path is used: yes, unless the environment sets
/// `TIDEMARK_JSON_FAST_PATH=off` (or `0`), which gives arrow-json alone, as before it
/// existed; for before-and-after benchmarks, and a way out should it ever disagree.
pub fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        !matches!(
            std::env::var("TIDEMARK_JSON_FAST_PATH").as_deref(),
            Ok("off" | "0" | "false")
        )
    })
}

/// A column's type, as this decoder reads it.
#[derive(Debug, Clone)]
enum Kind {
    Utf8,
    Int8,
    Int16,
    Int32,
    Int64,
    Float32,
    Float64,
    Boolean,
    /// Days since 1970, from `YYYY-MM-DD` strings (arrow's `Date32Type` parser).
    Date32,
    /// A timestamp in `unit`; strings without an offset are read in `tz` (UTC when the
    /// column has none), as arrow-json reads them.
    Timestamp(TimeUnit, Option<Tz>, Option<Arc<str>>),
}

impl Kind {
    fn of(t: &DataType) -> Option<Kind> {
        Some(match t {
            DataType::Utf8 => Kind::Utf8,
            DataType::Int8 => Kind::Int8,
            DataType::Int16 => Kind::Int16,
            DataType::Int32 => Kind::Int32,
            DataType::Int64 => Kind::Int64,
            DataType::Float32 => Kind::Float32,
            DataType::Float64 => Kind::Float64,
            DataType::Boolean => Kind::Boolean,
            DataType::Date32 => Kind::Date32,
            DataType::Timestamp(unit, tz) => {
                let parsed = match tz {
                    Some(tz) => Some(tz.parse::<Tz>().ok()?),
                    None => None,
                };
                Kind::Timestamp(*unit, parsed, tz.clone())
            }
            _ => return None,
        })
    }

    fn builder(&self, rows: usize) -> Builder {
        match self {
            Kind::Utf8 => Builder::Utf8(StringBuilder::with_capacity(rows, rows * 16)),
            Kind::Int8 => Builder::Int8(Int8Builder::with_capacity(rows)),
            Kind::Int16 => Builder::Int16(Int16Builder::with_capacity(rows)),
            Kind::Int32 => Builder::Int32(Int32Builder::with_capacity(rows)),
            Kind::Int64 => Builder::Int64(Int64Builder::with_capacity(rows)),
            Kind::Float32 => Builder::Float32(Float32Builder::with_capacity(rows)),
            Kind::Float64 => Builder::Float64(Float64Builder::with_capacity(rows)),
            Kind::Boolean => Builder::Boolean(BooleanBuilder::with_capacity(rows)),
            Kind::Date32 => Builder::Date32(Date32Builder::with_capacity(rows)),
            Kind::Timestamp(unit, _, tz) => match unit {
                TimeUnit::Second => Builder::TsSecond(
                    TimestampSecondBuilder::with_capacity(rows).with_timezone_opt(tz.clone()),
                ),
                TimeUnit::Millisecond => Builder::TsMilli(
                    TimestampMillisecondBuilder::with_capacity(rows).with_timezone_opt(tz.clone()),
                ),
                TimeUnit::Microsecond => Builder::TsMicro(
                    TimestampMicrosecondBuilder::with_capacity(rows).with_timezone_opt(tz.clone()),
                ),
                TimeUnit::Nanosecond => Builder::TsNano(
                    TimestampNanosecondBuilder::with_capacity(rows).with_timezone_opt(tz.clone()),
                ),
            },
        }
    }
}

/// One column being built.
enum Builder {
    Utf8(StringBuilder),
    Int8(Int8Builder),
    Int16(Int16Builder),
    Int32(Int32Builder),
    Int64(Int64Builder),
    Float32(Float32Builder),
    Float64(Float64Builder),
    Boolean(BooleanBuilder),
    Date32(Date32Builder),
    TsSecond(TimestampSecondBuilder),
    TsMilli(TimestampMillisecondBuilder),
    TsMicro(TimestampMicrosecondBuilder),
    TsNano(TimestampNanosecondBuilder),
}

impl Builder {
    fn append_null(&mut self) {
        match self {
            Builder::Utf8(b) => b.append_null(),
            Builder::Int8(b) => b.append_null(),
            Builder::Int16(b) => b.append_null(),
            Builder::Int32(b) => b.append_null(),
            Builder::Int64(b) => b.append_null(),
            Builder::Float32(b) => b.append_null(),
            Builder::Float64(b) => b.append_null(),
            Builder::Boolean(b) => b.append_null(),
            Builder::Date32(b) => b.append_null(),
            Builder::TsSecond(b) => b.append_null(),
            Builder::TsMilli(b) => b.append_null(),
            Builder::TsMicro(b) => b.append_null(),
            Builder::TsNano(b) => b.append_null(),
        }
    }

    fn finish(&mut self) -> ArrayRef {
        match self {
            Builder::Utf8(b) => Arc::new(b.finish()),
            Builder::Int8(b) => Arc::new(b.finish()),
            Builder::Int16(b) => Arc::new(b.finish()),
            Builder::Int32(b) => Arc::new(b.finish()),
            Builder::Int64(b) => Arc::new(b.finish()),
            Builder::Float32(b) => Arc::new(b.finish()),
            Builder::Float64(b) => Arc::new(b.finish()),
            Builder::Boolean(b) => Arc::new(b.finish()),
            Builder::Date32(b) => Arc::new(b.finish()),
            Builder::TsSecond(b) => Arc::new(b.finish()),
            Builder::TsMilli(b) => Arc::new(b.finish()),
            Builder::TsMicro(b) => Arc::new(b.finish()),
            Builder::TsNano(b) => Arc::new(b.finish()),
        }
    }

    /// Appends an integer, or `None` when it does not fit the column (arrow-json then
    /// fails the record).
    fn append_int(&mut self, v: i64) -> Option<()> {
        match self {
            Builder::Int8(b) => b.append_value(i8::try_from(v).ok()?),
            Builder::Int16(b) => b.append_value(i16::try_from(v).ok()?),
            Builder::Int32(b) => b.append_value(i32::try_from(v).ok()?),
            Builder::Int64(b) => b.append_value(v),
            _ => return None,
        }
        Some(())
    }

    #[inline(always)]
    fn append_timestamp(&mut self, v: i64) {
        match self {
            Builder::TsSecond(b) => b.append_value(v),
            Builder::TsMilli(b) => b.append_value(v),
            Builder::TsMicro(b) => b.append_value(v),
            Builder::TsNano(b) => b.append_value(v),
            _ => {}
        }
    }
}

/// The decoder for one schema: see the module's documentation.
#[derive(Debug)]
pub struct FlatJson {
    schema: SchemaRef,
    names: Vec<Name>,
    kinds: Vec<Kind>,
}

impl FlatJson {
    /// `None` when a column has a type this decoder does not read (a list, a struct, a
    /// decimal, ...): arrow-json decodes such schemas.
    pub fn new(schema: &SchemaRef) -> Option<FlatJson> {
        let kinds = schema
            .fields()
            .iter()
            .map(|f| Kind::of(f.data_type()))
            .collect::<Option<Vec<_>>>()?;
        Some(FlatJson {
            schema: schema.clone(),
            names: schema
                .fields()
                .iter()
                .map(|f| f.name().as_bytes().into())
                .collect(),
            kinds,
        })
    }

    /// The records in `input` (JSON objects separated by whitespace), in batches of
    /// `batch_size` rows; `None` when arrow-json should decode the text instead.
    pub fn decode(&self, input: &[u8], batch_size: usize) -> Option<Vec<RecordBatch>> {
        let text = simdutf8::basic::from_utf8(input).ok()?;
        let batch_size = batch_size.max(1);
        let mut d = Decoding {
            text,
            b: input,
            pos: 0,
            scratch: String::new(),
            last_date: None,
        };
        let n = self.kinds.len();
        // `filled[f] == row`: column f has its value for this row.
        let mut filled = vec![0u64; n];
        // The column the k-th member named in the previous record, and how its name reads.
        let mut order: Vec<Slot> = Vec::with_capacity(n);
        let estimate = (input.len() / 64).clamp(1, batch_size);
        let mut builders: Vec<Builder> = self.kinds.iter().map(|k| k.builder(estimate)).collect();
        let mut out = Vec::new();
        let mut rows = 0usize;
        let mut row = 0u64;
        loop {
            d.skip_ws();
            let Some(&first) = d.b.get(d.pos) else { break };
            if first != b'{' {
                return None;
            }
            d.pos += 1;
            row += 1;
            // How many columns got a value in this record.
            let mut got = 0;
            d.skip_ws();
            if d.peek()? == b'}' {
                d.pos += 1;
            } else {
                let mut k = 0;
                loop {
                    // The member's name and its colon.
                    let field = match order.get(k) {
                        Some(slot) if d.slot_is(slot, &self.names) => Some(slot.field),
                        _ => {
                            if d.peek()? != b'"' {
                                return None;
                            }
                            d.pos += 1;
                            let f = d.key(&self.names)?;
                            if let Some(f) = f {
                                let slot = Slot::new(f, &self.names[f]);
                                if k < order.len() {
                                    order[k] = slot;
                                } else if k == order.len() {
                                    order.push(slot);
                                }
                            }
                            d.skip_ws();
                            if d.peek()? != b':' {
                                return None;
                            }
                            d.pos += 1;
                            f
                        }
                    };
                    d.skip_ws();
                    match field {
                        Some(f) => {
                            if filled[f] == row {
                                return None;
                            }
                            filled[f] = row;
                            got += 1;
                            d.value(&self.kinds[f], &mut builders[f])?;
                        }
                        None => d.skip_scalar()?,
                    }
                    // `,` or `}`, most often right after the value.
                    if d.peek() == Some(b',') {
                        d.pos += 1;
                        d.skip_ws();
                        k += 1;
                        continue;
                    }
                    d.skip_ws();
                    match d.peek()? {
                        b',' => {
                            d.pos += 1;
                            d.skip_ws();
                            k += 1;
                        }
                        b'}' => {
                            d.pos += 1;
                            break;
                        }
                        _ => return None,
                    }
                }
            }
            if got < n {
                for (f, b) in builders.iter_mut().enumerate() {
                    if filled[f] != row {
                        b.append_null();
                    }
                }
            }
            rows += 1;
            if rows == batch_size {
                out.push(self.batch(&mut builders)?);
                rows = 0;
            }
        }
        if rows > 0 {
            out.push(self.batch(&mut builders)?);
        }
        Some(out)
    }

    fn batch(&self, builders: &mut [Builder]) -> Option<RecordBatch> {
        let columns = builders.iter_mut().map(Builder::finish).collect();
        RecordBatch::try_new(self.schema.clone(), columns).ok()
    }
}

/// A column's name as members name it.
type Name = Box<[u8]>;

/// A member expected at some place in a record: its column and, for a name of at most 13
/// bytes, `"name":` as a little-endian word, the mask of those bytes and their count
/// (`len == 0` for a longer name, compared byte by byte).
#[derive(Debug, Clone, Copy)]
struct Slot {
    field: usize,
    word: u128,
    mask: u128,
    len: usize,
}

impl Slot {
    fn new(field: usize, name: &Name) -> Slot {
        if name.len() > 13 {
            return Slot {
                field,
                word: 0,
                mask: 0,
                len: 0,
            };
        }
        let len = name.len() + 3;
        let mut word = [0u8; 16];
        word[0] = b'"';
        word[1..=name.len()].copy_from_slice(name);
        word[len - 2..len].copy_from_slice(b"\":");
        let mut mask = [0u8; 16];
        mask[..len].fill(0xff);
        Slot {
            field,
            word: u128::from_le_bytes(word),
            mask: u128::from_le_bytes(mask),
            len,
        }
    }
}

/// The text being decoded, and where the decoder is in it.
struct Decoding<'a> {
    text: &'a str,
    b: &'a [u8],
    pos: usize,
    /// A string with escapes, unescaped.
    scratch: String,
    /// The date part of the last timestamp read, and its day number.
    last_date: Option<([u8; 10], i64)>,
}

impl Decoding<'_> {
    #[inline]
    fn peek(&self) -> Option<u8> {
        self.b.get(self.pos).copied()
    }

    #[inline]
    fn skip_ws(&mut self) {
        while let Some(b' ' | b'\n' | b'\r' | b'\t') = self.b.get(self.pos) {
            self.pos += 1;
        }
    }

    /// At a member: whether it is the one `slot` expects (then skipped).
    #[inline(always)]
    fn slot_is(&mut self, slot: &Slot, names: &[Name]) -> bool {
        if slot.len > 0
            && let Some(at) = self.b.get(self.pos..self.pos + 16)
        {
            // The quotes, the name and the colon, compared in one 16-byte word.
            let v = u128::from_le_bytes(at.try_into().unwrap_or_default());
            if v & slot.mask == slot.word {
                self.pos += slot.len;
                return true;
            }
            return false;
        }
        self.member_is(&names[slot.field])
    }

    /// At a member: whether it is `"name":` exactly (then skipped), byte by byte: for a
    /// name too long for [`Slot`]'s word, or near the text's end. `false` leaves the
    /// position as it was, for [`Decoding::key`].
    #[inline]
    fn member_is(&mut self, name: &Name) -> bool {
        let start = self.pos + 1;
        let end = start + name.len();
        if self.b.get(self.pos) == Some(&b'"')
            && self.b.get(start..end) == Some(&name[..])
            && self.b.get(end..end + 2) == Some(b"\":")
        {
            self.pos = end + 2;
            true
        } else {
            false
        }
    }

    /// After an opening quote: the column a member name names (`Some(None)` for none).
    /// An escaped name declines.
    fn key(&mut self, names: &[Name]) -> Option<Option<usize>> {
        let start = self.pos;
        let end = quote_or_backslash(self.b, start)?;
        if self.b[end] != b'"' {
            return None;
        }
        self.pos = end + 1;
        let key = &self.b[start..end];
        Some(names.iter().position(|n| **n == *key))
    }

    /// After an opening quote: the string's text, unescaped as arrow-json unescapes it.
    #[inline(always)]
    fn string(&mut self) -> Option<&str> {
        let start = self.pos;
        let end = quote_or_backslash(self.b, start)?;
        if self.b[end] == b'"' {
            self.pos = end + 1;
            return self.text.get(start..end);
        }
        self.escaped(start, end)
    }

    /// [`Decoding::string`] from its first backslash, at `end`.
    #[cold]
    #[inline(never)]
    fn escaped(&mut self, start: usize, end: usize) -> Option<&str> {
        self.scratch.clear();
        self.scratch.push_str(self.text.get(start..end)?);
        self.pos = end;
        loop {
            // At a backslash.
            let (c, len) = match *self.b.get(self.pos + 1)? {
                b'"' => ('"', 2),
                b'\\' => ('\\', 2),
                b'/' => ('/', 2),
                b'b' => ('\u{8}', 2),
                b'f' => ('\u{c}', 2),
                b'n' => ('\n', 2),
                b'r' => ('\r', 2),
                b't' => ('\t', 2),
                b'u' => {
                    let high = self.hex4(self.pos + 2)?;
                    match char::from_u32(u32::from(high)) {
                        Some(c) => (c, 6),
                        None => {
                            // A surrogate: a second \u escape must follow, as arrow-json
                            // requires, and the two must make a pair.
                            if self.b.get(self.pos + 6..self.pos + 8) != Some(b"\\u") {
                                return None;
                            }
                            let low = self.hex4(self.pos + 8)?;
                            (surrogate_pair(low, high)?, 12)
                        }
                    }
                }
                _ => return None,
            };
            self.scratch.push(c);
            let rest = self.pos + len;
            let end = quote_or_backslash(self.b, rest)?;
            self.scratch.push_str(self.text.get(rest..end)?);
            if self.b[end] == b'"' {
                self.pos = end + 1;
                return Some(&self.scratch);
            }
            self.pos = end;
        }
    }

    fn hex4(&self, at: usize) -> Option<u16> {
        let digits = self.b.get(at..at + 4)?;
        digits.iter().try_fold(0u16, |v, &d| {
            let x = match d {
                b'0'..=b'9' => d - b'0',
                b'a'..=b'f' => d - b'a' + 10,
                b'A'..=b'F' => d - b'A' + 10,
                _ => return None,
            };
            Some((v << 4) | u16::from(x))
        })
    }

    /// A JSON number (RFC 8259's grammar, stricter than arrow-json's scan): its text, and
    /// whether it is an integer (no fraction, no exponent).
    #[inline]
    fn number(&mut self) -> Option<(&str, bool)> {
        let start = self.pos;
        let b = self.b;
        let mut p = start;
        if b.get(p) == Some(&b'-') {
            p += 1;
        }
        match b.get(p) {
            Some(b'0') => p += 1,
            Some(b'1'..=b'9') => {
                while let Some(b'0'..=b'9') = b.get(p) {
                    p += 1;
                }
            }
            _ => return None,
        }
        let mut integer = true;
        if b.get(p) == Some(&b'.') {
            integer = false;
            p += 1;
            let digits = p;
            while let Some(b'0'..=b'9') = b.get(p) {
                p += 1;
            }
            if p == digits {
                return None;
            }
        }
        if let Some(b'e' | b'E') = b.get(p) {
            integer = false;
            p += 1;
            if let Some(b'+' | b'-') = b.get(p) {
                p += 1;
            }
            let digits = p;
            while let Some(b'0'..=b'9') = b.get(p) {
                p += 1;
            }
            if p == digits {
                return None;
            }
        }
        // arrow-json's number runs on over these; a number our grammar ends before one of
        // them would be read differently there.
        if let Some(b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E') = b.get(p) {
            return None;
        }
        self.pos = p;
        Some((self.text.get(start..p)?, integer))
    }

    /// A JSON number read as an `f64`: a short one by [`short_float`], any other as
    /// arrow-json reads it (`lexical-core`), or `None` where the grammar refuses it.
    #[inline]
    fn float64(&mut self) -> Option<f64> {
        if let Some((v, end)) = short_float(self.b, self.pos) {
            self.pos = end;
            return Some(v);
        }
        let (text, _) = self.number()?;
        lexical_core::parse::<f64>(text.as_bytes()).ok()
    }

    /// After an opening quote: a timestamp in the common form, read where it stands (no
    /// scan for the closing quote first), and the closing quote's position; `None` for a
    /// string of any other shape (an escape, another form), which [`Decoding::value`]
    /// then reads as a string.
    #[inline]
    fn plain_timestamp(&mut self, local_is_utc: bool) -> Option<(Instant, usize)> {
        let b = self.b;
        let mut end = self.pos + 19;
        if b.get(end) == Some(&b'.') {
            end += 1;
            while let Some(b'0'..=b'9') = b.get(end) {
                end += 1;
            }
        }
        if b.get(end) == Some(&b'Z') {
            end += 1;
        }
        if b.get(end) != Some(&b'"') {
            return None;
        }
        let t = iso_utc(&b[self.pos..end], local_is_utc, &mut self.last_date)?;
        Some((t, end))
    }

    /// `null`, `true` or `false` (after checking the first letter).
    #[inline]
    fn literal(&mut self, word: &[u8]) -> Option<()> {
        if self.b.get(self.pos..self.pos + word.len()) == Some(word) {
            self.pos += word.len();
            Some(())
        } else {
            None
        }
    }

    /// A member's value, appended to its column; `None` declines.
    #[inline]
    fn value(&mut self, kind: &Kind, builder: &mut Builder) -> Option<()> {
        let first = self.peek()?;
        if first == b'n' {
            self.literal(b"null")?;
            builder.append_null();
            return Some(());
        }
        match (kind, builder) {
            (Kind::Utf8, Builder::Utf8(out)) => match first {
                b'"' => {
                    self.pos += 1;
                    out.append_value(self.string()?);
                }
                // arrow-json's `coerce_primitive`: a number keeps its text, a boolean its word.
                b't' => {
                    self.literal(b"true")?;
                    out.append_value("true");
                }
                b'f' => {
                    self.literal(b"false")?;
                    out.append_value("false");
                }
                b'-' | b'0'..=b'9' => out.append_value(self.number()?.0),
                _ => return None,
            },
            (Kind::Int8 | Kind::Int16 | Kind::Int32 | Kind::Int64, out) => {
                let (text, integer) = self.number()?;
                if !integer {
                    return None;
                }
                out.append_int(parse_int(text)?)?;
            }
            (Kind::Float64, Builder::Float64(out)) => out.append_value(self.float64()?),
            (Kind::Float32, Builder::Float32(out)) => {
                let (text, _) = self.number()?;
                out.append_value(lexical_core::parse::<f32>(text.as_bytes()).ok()?);
            }
            (Kind::Boolean, Builder::Boolean(out)) => match first {
                b't' => {
                    self.literal(b"true")?;
                    out.append_value(true);
                }
                b'f' => {
                    self.literal(b"false")?;
                    out.append_value(false);
                }
                _ => return None,
            },
            (Kind::Date32, Builder::Date32(out)) => {
                if first != b'"' {
                    return None;
                }
                self.pos += 1;
                out.append_value(Date32Type::parse(self.string()?)?);
            }
            (Kind::Timestamp(unit, tz, _), out) => {
                if first != b'"' {
                    return None;
                }
                self.pos += 1;
                if let Some((t, end)) = self.plain_timestamp(tz.is_none()) {
                    out.append_timestamp(t.in_unit(*unit)?);
                    self.pos = end + 1;
                    return Some(());
                }
                let mut last_date = self.last_date.take();
                let s = self.string()?;
                let v = match (iso_utc(s.as_bytes(), tz.is_none(), &mut last_date), tz) {
                    (Some(t), _) => t.in_unit(*unit)?,
                    (None, None) => in_unit(string_to_datetime(&chrono::Utc, s).ok()?, *unit)?,
                    (None, Some(tz)) => in_unit(string_to_datetime(tz, s).ok()?, *unit)?,
                };
                out.append_timestamp(v);
                self.last_date = last_date;
            }
            _ => return None,
        }
        Some(())
    }

    /// The value of a member no column reads: a string without escapes, a number or a
    /// literal. Anything else declines (arrow-json checks it all).
    fn skip_scalar(&mut self) -> Option<()> {
        match self.peek()? {
            b'"' => {
                let start = self.pos + 1;
                let end = quote_or_backslash(self.b, start)?;
                if self.b[end] != b'"' {
                    return None;
                }
                self.pos = end + 1;
            }
            b'-' | b'0'..=b'9' => {
                self.number()?;
            }
            b'n' => self.literal(b"null")?,
            b't' => self.literal(b"true")?,
            b'f' => self.literal(b"false")?,
            _ => return None,
        }
        Some(())
    }
}

/// A number of at most seven digits before the point and seven after it and no
/// exponent, read eight bytes at a time, and where it ends; `None` for any other text,
/// which [`Decoding::float64`] then reads as arrow-json does. Its digits make an integer
/// mantissa below 10^14, exact in an `f64`, and the quotient by an exact power of ten is
/// then correctly rounded: the value `lexical-core` gives too (its own fast path is this
/// one, Clinger's).
#[inline(always)]
fn short_float(b: &[u8], start: usize) -> Option<(f64, usize)> {
    let negative = b.get(start) == Some(&b'-');
    let mut p = start + usize::from(negative);
    let (n, int) = digits8(b, p)?;
    if n == 0 || n == 8 || (n > 1 && b[p] == b'0') {
        return None;
    }
    p += n;
    let (mantissa, fraction) = if b.get(p) == Some(&b'.') {
        let (f, frac) = digits8(b, p + 1)?;
        if f == 0 || f == 8 {
            return None;
        }
        p += 1 + f;
        (int * TENS[f] + frac, f)
    } else {
        (int, 0)
    };
    if let Some(b'e' | b'E' | b'0'..=b'9' | b'-' | b'+' | b'.') = b.get(p) {
        return None;
    }
    let v = mantissa as f64 / POWERS_OF_TEN[fraction];
    Some((if negative { -v } else { v }, p))
}

/// How many of the eight bytes at `at` are ASCII digits before the first that is not
/// (8: all of them), and the value of those digits.
#[inline(always)]
fn digits8(b: &[u8], at: usize) -> Option<(usize, u64)> {
    const LOW: u64 = 0x0F0F_0F0F_0F0F_0F0F;
    const HIGH: u64 = 0xF0F0_F0F0_F0F0_F0F0;
    const ZEROS: u64 = 0x3030_3030_3030_3030;
    const SEVENS: u64 = 0x7F7F_7F7F_7F7F_7F7F;
    let x = u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?);
    // A byte of `other` is not zero where `x`'s byte is not a digit: its high half is not
    // 3, or adding 6 carries into it. A carry can come only out of such a byte, so it
    // never changes the first one.
    let other = ((x & HIGH) ^ ZEROS) | ((x.wrapping_add(0x0606_0606_0606_0606) & HIGH) ^ ZEROS);
    let flags = (((other & SEVENS) + SEVENS) | other) & !SEVENS;
    let n = (flags.trailing_zeros() / 8) as usize;
    if n == 0 {
        return Some((0, 0));
    }
    // The digits' values in the top `n` bytes, the first the most significant; the zero
    // bytes below are leading zeros. Then pairs, fours and eights are combined.
    let d = (x & LOW) << (8 * (8 - n));
    let d = d.wrapping_mul(10).wrapping_add(d >> 8);
    let d = ((d & 0x0000_00FF_0000_00FF)
        .wrapping_mul(0x000F_4240_0000_0064)
        .wrapping_add(((d >> 16) & 0x0000_00FF_0000_00FF).wrapping_mul(0x0000_2710_0000_0001)))
        >> 32;
    Some((n, d))
}

/// 10^n for the fraction's digits.
const TENS: [u64; 8] = [1, 10, 100, 1_000, 10_000, 100_000, 1_000_000, 10_000_000];

/// The powers of ten an `f64` holds exactly.
const POWERS_OF_TEN: [f64; 23] = [
    1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16,
    1e17, 1e18, 1e19, 1e20, 1e21, 1e22,
];

/// The first `"` or `\\` at or after `from`: eight bytes at a time in a word (most values
/// are short), then `memchr`'s SIMD scan for a long string.
#[inline]
fn quote_or_backslash(b: &[u8], from: usize) -> Option<usize> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    let mut at = from;
    for _ in 0..4 {
        let Some(word) = b.get(at..at + 8) else { break };
        let v = u64::from_le_bytes(word.try_into().ok()?);
        // The bytes of `v` equal to `c` have their high bit set here (the lowest such
        // byte exactly; bytes above it may be false alarms, which the scan never reads).
        let eq = |c: u8| {
            let x = v ^ (ONES * u64::from(c));
            x.wrapping_sub(ONES) & !x & HIGHS
        };
        let found = eq(b'"') | eq(b'\\');
        if found != 0 {
            return Some(at + (found.trailing_zeros() / 8) as usize);
        }
        at += 8;
    }
    Some(at + memchr::memchr2(b'"', b'\\', b.get(at..)?)?)
}

/// An integer's text as arrow-json reads it into an integer column (`lexical-core`), for
/// a text our number grammar took as an integer.
#[inline]
fn parse_int(text: &str) -> Option<i64> {
    let b = text.as_bytes();
    let (neg, digits) = match b.first() {
        Some(b'-') => (true, &b[1..]),
        _ => (false, b),
    };
    if digits.len() <= 18 {
        let v = digits
            .iter()
            .fold(0i64, |v, &d| v * 10 + i64::from(d - b'0'));
        Some(if neg { -v } else { v })
    } else {
        lexical_core::parse::<i64>(b).ok()
    }
}

/// A UTC instant: seconds since 1970 and the nanoseconds after them.
#[derive(Debug, PartialEq)]
struct Instant {
    secs: i64,
    nanos: u32,
}

impl Instant {
    /// In `unit`, as chrono's `timestamp*` functions give it.
    #[inline(always)]
    fn in_unit(&self, unit: TimeUnit) -> Option<i64> {
        let n = i64::from(self.nanos);
        Some(match unit {
            TimeUnit::Second => self.secs,
            TimeUnit::Millisecond => self.secs * 1_000 + n / 1_000_000,
            TimeUnit::Microsecond => self.secs * 1_000_000 + n / 1_000,
            TimeUnit::Nanosecond => self.secs.checked_mul(1_000_000_000)?.checked_add(n)?,
        })
    }
}

/// The common form `YYYY-MM-DD[T ]HH:MM:SS[.fffffffff][Z]` read without chrono; `None`
/// for any other form or an impossible date or time, which arrow's `string_to_datetime`
/// then reads (or refuses). Without `Z` the text is UTC only where the column has no
/// time zone (`local_is_utc`); in a zoned column it is local time, left to arrow.
#[inline]
fn iso_utc(
    s: &[u8],
    local_is_utc: bool,
    last_date: &mut Option<([u8; 10], i64)>,
) -> Option<Instant> {
    let mut end = s.len();
    if s.last() == Some(&b'Z') {
        end -= 1;
    } else if !local_is_utc {
        return None;
    }
    if end < 19 {
        return None;
    }
    // A fixed-size head: the reads below need no bounds checks.
    let head: &[u8; 19] = s.get(..19)?.try_into().ok()?;
    if head[4] != b'-'
        || head[7] != b'-'
        || !matches!(head[10], b'T' | b' ')
        || head[13] != b':'
        || head[16] != b':'
    {
        return None;
    }
    let two = |i: usize| -> Option<u32> {
        let (a, b) = (head[i].wrapping_sub(b'0'), head[i + 1].wrapping_sub(b'0'));
        (a < 10 && b < 10).then(|| u32::from(a) * 10 + u32::from(b))
    };
    let (hour, minute, second) = (two(11)?, two(14)?, two(17)?);
    let nanos = match end - 19 {
        0 => 0,
        n if (2..=10).contains(&n) && s[19] == b'.' => {
            let mut v = 0u32;
            for &d in &s[20..end] {
                let d = d.wrapping_sub(b'0');
                if d >= 10 {
                    return None;
                }
                v = v * 10 + u32::from(d);
            }
            v * [
                0,
                0,
                100_000_000,
                10_000_000,
                1_000_000,
                100_000,
                10_000,
                1_000,
                100,
                10,
                1,
            ][n]
        }
        _ => return None,
    };
    if hour > 23 || minute > 59 || second > 59 {
        return None;
    }
    // Rows close in time share their date: it is read once.
    let date: [u8; 10] = s[..10].try_into().ok()?;
    let days = match last_date {
        Some((text, days)) if *text == date => *days,
        _ => {
            let (year, month, day) = (two(0)? * 100 + two(2)?, two(5)?, two(8)?);
            let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
            let month_days = match month {
                1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
                4 | 6 | 9 | 11 => 30,
                2 if leap => 29,
                2 => 28,
                _ => return None,
            };
            if day == 0 || day > month_days {
                return None;
            }
            let days = days_from_civil(i64::from(year), month, day);
            *last_date = Some((date, days));
            days
        }
    };
    Some(Instant {
        secs: days * 86_400 + i64::from(hour * 3_600 + minute * 60 + second),
        nanos,
    })
}

/// Days from 1970-01-01 to a date of the proleptic Gregorian calendar (Howard Hinnant's
/// `days_from_civil`).
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = i64::from(month);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// A timestamp in `unit`, as arrow-json converts it.
fn in_unit<T: chrono::TimeZone>(d: chrono::DateTime<T>, unit: TimeUnit) -> Option<i64> {
    Some(match unit {
        TimeUnit::Second => d.timestamp(),
        TimeUnit::Millisecond => d.timestamp_millis(),
        TimeUnit::Microsecond => d.timestamp_micros(),
        TimeUnit::Nanosecond => d.timestamp_nanos_opt()?,
    })
}

/// A character from a UTF-16 surrogate pair, as arrow-json combines them.
fn surrogate_pair(low: u16, high: u16) -> Option<char> {
    match (low, high) {
        (0xDC00..=0xDFFF, 0xD800..=0xDBFF) => {
            let n = ((u32::from(high) - 0xD800) << 10) | (u32::from(low) - 0xDC00 + 0x1_0000);
            char::from_u32(n)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::datatypes::{Field, Schema};
    use proptest::prelude::*;

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("s", DataType::Utf8, true),
            Field::new("i", DataType::Int64, true),
            Field::new("i32", DataType::Int32, true),
            Field::new("i8", DataType::Int8, true),
            Field::new("f", DataType::Float64, true),
            Field::new("f32", DataType::Float32, true),
            Field::new("b", DataType::Boolean, true),
            Field::new("d", DataType::Date32, true),
            Field::new("t", DataType::Timestamp(TimeUnit::Microsecond, None), true),
            Field::new(
                "tz",
                DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
                true,
            ),
            Field::new(
                "tn",
                DataType::Timestamp(TimeUnit::Nanosecond, Some("+02:00".into())),
                true,
            ),
        ]))
    }

    /// arrow-json's batches, as the file source decodes without the fast path.
    fn arrow(schema: &SchemaRef, text: &[u8], batch: usize) -> Option<Vec<RecordBatch>> {
        datafusion::arrow::json::ReaderBuilder::new(schema.clone())
            .with_batch_size(batch)
            .with_coerce_primitive(true)
            .build(text)
            .ok()?
            .collect::<Result<Vec<_>, _>>()
            .ok()
    }

    /// The fast path gives arrow-json's batches or declines; never a different answer,
    /// never an answer where arrow-json fails. Returns whether it took the text.
    fn same_as_arrow(schema: &SchemaRef, text: &[u8], batch: usize) -> bool {
        let fast = FlatJson::new(schema).unwrap().decode(text, batch);
        let slow = arrow(schema, text, batch);
        match (fast, slow) {
            (Some(f), Some(s)) => {
                assert_eq!(f, s, "{}", String::from_utf8_lossy(text));
                true
            }
            (Some(f), None) => panic!(
                "arrow-json fails, the fast path gave {f:?}: {}",
                String::from_utf8_lossy(text)
            ),
            (None, _) => false,
        }
    }

    #[test]
    fn takes_flat_records_and_gives_arrow_json_batches() {
        let s = schema();
        for text in [
            "",
            "\n\n",
            r#"{"s":"a","i":1,"i32":-2,"i8":127,"f":1.5,"f32":0.1,"b":true,"d":"2026-06-10","t":"2026-06-10T10:04:48.406Z","tz":"2026-06-10 10:04:48","tn":"2026-06-10T10:04:48.123456789"}"#,
            "{}\n{\"s\":null}\r\n  {\"i\":-0} {\"f\":-0}\n",
            // Members in another order, unknown members, a member missing.
            r#"{"b":false,"x":"y","s":"q","zz":12.5e3,"n":null,"t":"2026-01-01"}
               {"s":"r","b":true}"#,
            // Strings: escapes, surrogate pairs, non-ASCII text, numbers and booleans
            // into a text column keep their text.
            r#"{"s":"a\"b\\c\/d\b\f\n\r\t\u00e9\ud83d\ude00 é"}
               {"s":12.50}{"s":-3e+2}{"s":true}{"s":false}"#,
            // Integers at the edges of their columns.
            r#"{"i":9223372036854775807,"i32":2147483647,"i8":-128}
               {"i":-9223372036854775808,"i32":-2147483648,"i8":0}"#,
            // Floats at the edges.
            r#"{"f":1e400,"f32":1e50}{"f":-1e-400,"f32":3.4028235e38}{"f":0.1e1}"#,
            // Timestamps in arrow's other forms, before 1970 too.
            r#"{"t":"1969-12-31T23:59:59.999999Z","tz":"2026-06-10T10:04:48+05:30"}
               {"t":"1900-02-28 00:00:00.5","tn":"2026-06-10T10:04:48Z"}"#,
        ] {
            assert!(same_as_arrow(&s, text.as_bytes(), 3), "declined: {text}");
        }
    }

    #[test]
    fn short_decimals_are_read_eight_bytes_at_a_time() {
        let text = b"60.032,\"page\":\"/docs\"}";
        assert_eq!(short_float(text, 0), Some((60.032, 6)));
        assert_eq!(short_float(b"-0.5}       ", 0), Some((-0.5, 4)));
        assert_eq!(
            short_float(b"-0}         ", 0).map(|(v, _)| v.to_bits()),
            Some((-0.0f64).to_bits())
        );
        // Eight digits, an exponent, a leading zero: read a digit at a time.
        for other in [
            &b"12345678.5}       "[..],
            b"1.12345678}      ",
            b"1.5e3}          ",
            b"012}            ",
        ] {
            assert_eq!(
                short_float(other, 0),
                None,
                "{}",
                String::from_utf8_lossy(other)
            );
        }
    }

    #[test]
    fn names_longer_than_the_word_and_spaces_before_the_colon_read_as_arrow_reads_them() {
        // 13 bytes is the longest name matched in one word (`"name":` in 16 bytes).
        let s = Arc::new(Schema::new(vec![
            Field::new("a", DataType::Int64, true),
            Field::new("thirteen_byte", DataType::Utf8, true),
            Field::new("fourteen_bytes", DataType::Float64, true),
            Field::new("a_name_of_twenty_six_bytes", DataType::Utf8, true),
        ]));
        for text in [
            r#"{"a":1,"thirteen_byte":"x","fourteen_bytes":2.5,"a_name_of_twenty_six_bytes":"y"}
               {"a":2,"thirteen_byte":"z","fourteen_bytes":3.5,"a_name_of_twenty_six_bytes":"w"}"#,
            // The order changes from one record to the next, and back.
            r#"{"a_name_of_twenty_six_bytes":"y","fourteen_bytes":1,"a":1}
               {"a":2,"a_name_of_twenty_six_bytes":"v"}
               {"a_name_of_twenty_six_bytes":"u","fourteen_bytes":-0.25,"a":3}"#,
            // Whitespace between a name and its colon, and around the value.
            "{\"a\" :1,\"thirteen_byte\"\t: \"x\" ,\"fourteen_bytes\"\n:2}\n{\"a\":2}",
            // A name that starts like a column's and goes on; a prefix of one.
            r#"{"thirteen_bytes":"no","a":1}{"thirteen_byt":"no","a":2}{"aa":3,"a":4}"#,
            // At the end of the text, too short for a 16-byte read.
            r#"{"a":1}"#,
        ] {
            assert!(same_as_arrow(&s, text.as_bytes(), 2), "declined: {text}");
        }
    }

    #[test]
    fn declines_what_arrow_json_decides() {
        let s = schema();
        // Malformed records: arrow-json fails them, and the slow path then applies `mode`.
        for text in [
            "{\"s\":\"a\"",
            "{\"s\" \"a\"}",
            "[1,2]",
            "{\"i\":1.5e400}",
            "{\"i\":9223372036854775808e5}",
            "{\"i32\":2147483648}",
            "{\"i8\":128}",
            "{\"b\":1}",
            "{\"t\":\"yesterday\"}",
            "{\"d\":\"2026-02-30\"}",
            "{\"t\":\"2026-02-29T00:00:00Z\"}",
            "{\"t\":\"1900-02-29 00:00:00\"}",
            "{\"t\":\"2026-04-31T00:00:00\"}",
            "{\"t\":\"2026-04-30T24:00:00\"}",
            "{\"s\":\"\\x\"}",
            "{\"s\":\"\\ud800\"}",
            "{\"s\":\"\\ud800\\u0041\"}",
            "{\"s\":nul}",
            "{\"f\":.5}",
            "{\"i\":1-2}",
        ] {
            assert!(
                arrow(&s, text.as_bytes(), 2).is_none(),
                "arrow-json takes {text}"
            );
            assert!(!same_as_arrow(&s, text.as_bytes(), 2), "took {text}");
        }
        // Text arrow-json takes by rules of its own: nested values, a number in a string,
        // a fraction for an integer, a duplicated member, an escaped member name, missing
        // or doubled commas, escapes in a member no column reads.
        for text in [
            "{\"x\":{\"a\":1},\"s\":\"a\"}",
            "{\"x\":[1],\"s\":\"a\"}",
            "{\"i\":\"12\"}",
            "{\"i\":1.5}",
            "{\"i\":01}",
            "{\"f\":1.}",
            "{\"d\":17000}",
            "{\"s\":\"a\",\"s\":\"b\"}",
            "{\"\\u0073\":\"a\"}",
            "{\"s\":\"a\" \"i\":1}",
            "{\"s\":\"a\",,\"i\":1}",
            "{\"x\":\"a\\nb\",\"s\":\"a\"}",
        ] {
            assert!(
                arrow(&s, text.as_bytes(), 2).is_some(),
                "arrow-json fails {text}"
            );
            assert!(!same_as_arrow(&s, text.as_bytes(), 2), "took {text}");
        }
    }

    /// Every JSON input of the Spark oracle cases (`tests/oracle/cases`, whose expected
    /// rows Spark made) and of the sqllogictest files (`sql/data`), read with the seed
    /// schema: the oracle inputs must all be taken, and whatever is taken must equal
    /// arrow-json's batches.
    #[test]
    fn the_oracle_and_slt_inputs_decode_as_arrow_json_does() {
        let s: SchemaRef = Arc::new(Schema::new(vec![
            Field::new("user_id", DataType::Utf8, true),
            Field::new("page", DataType::Utf8, true),
            Field::new(
                "event_time",
                DataType::Timestamp(TimeUnit::Microsecond, None),
                true,
            ),
            Field::new("duration_s", DataType::Float64, true),
        ]));
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut files = Vec::new();
        let mut dirs = vec![root.join("tests/oracle/cases"), root.join("sql/data")];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() && !path.ends_with("expected") {
                    dirs.push(path);
                } else if path.extension().is_some_and(|e| e == "json")
                    && !path.ends_with("case.json")
                {
                    files.push(path);
                }
            }
        }
        let (mut oracle, mut taken) = (0, 0);
        for path in &files {
            let text = std::fs::read(path).unwrap();
            let took = same_as_arrow(&s, &text, 7);
            if path.starts_with(root.join("tests/oracle")) {
                oracle += 1;
                assert!(took, "declined an oracle input: {}", path.display());
            }
            taken += usize::from(took);
        }
        assert!(oracle >= 20, "{oracle} oracle inputs found");
        assert!(taken >= oracle, "{taken} of {} files taken", files.len());
    }

    #[test]
    fn declines_bytes_that_are_not_utf8() {
        assert!(!same_as_arrow(&schema(), b"{\"s\":\"\xff\"}", 2));
        assert!(!same_as_arrow(&schema(), b"{\"x\":\"\xc3\"}", 2));
    }

    #[test]
    fn a_schema_with_other_types_is_left_to_arrow_json() {
        let s: SchemaRef = Arc::new(Schema::new(vec![Field::new(
            "d",
            DataType::Decimal128(10, 2),
            true,
        )]));
        assert!(FlatJson::new(&s).is_none());
        let s: SchemaRef = Arc::new(Schema::new(vec![Field::new(
            "t",
            DataType::Timestamp(TimeUnit::Second, Some("Nowhere/Else".into())),
            true,
        )]));
        assert!(FlatJson::new(&s).is_none());
    }

    /// A JSON string literal for any text: serde_json's escapes, and at times the same
    /// text with every character escaped as \uXXXX (surrogate pairs beyond the BMP).
    fn string_literal() -> impl Strategy<Value = String> {
        (any::<String>(), any::<bool>()).prop_map(|(s, escape_all)| {
            if escape_all {
                let mut out = String::from("\"");
                for unit in s.encode_utf16() {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
                out.push('"');
                out
            } else {
                serde_json::to_string(&s).unwrap()
            }
        })
    }

    fn timestamp_literal() -> impl Strategy<Value = String> {
        (
            // Century and leap years, and month ends, often.
            prop_oneof![
                0..10_000u32,
                prop::sample::select(vec![0, 1600, 1900, 1970, 2000, 2023, 2024, 2100, 9999]),
            ],
            0..14u32,
            prop_oneof![0..33u32, prop::sample::select(vec![28, 29, 30, 31])],
            0..25u32,
            0..61u32,
            0..61u32,
            prop::option::of("[0-9]{1,10}"),
            prop::sample::select(vec!["", "Z", "z", "+01:00", "-05:30", " UTC"]),
            prop::sample::select(vec!["T", " ", "t", "_"]),
            any::<bool>(),
        )
            .prop_map(|(y, mo, d, h, mi, s, frac, zone, sep, date_only)| {
                if date_only {
                    format!("\"{y:04}-{mo:02}-{d:02}\"")
                } else {
                    let frac = frac.map(|f| format!(".{f}")).unwrap_or_default();
                    format!("\"{y:04}-{mo:02}-{d:02}{sep}{h:02}:{mi:02}:{s:02}{frac}{zone}\"")
                }
            })
    }

    /// Decimals of the lengths [`short_float`] reads, and a little past them.
    fn short_decimal() -> impl Strategy<Value = String> {
        (
            any::<bool>(),
            0u64..100_000_000,
            prop::option::of((0usize..10, 0u64..1_000_000_000)),
        )
            .prop_map(|(negative, int, fraction)| {
                let sign = if negative { "-" } else { "" };
                match fraction {
                    None => format!("{sign}{int}"),
                    Some((digits, f)) => {
                        let f = f.to_string();
                        let f = &f[..digits.min(f.len())];
                        format!("{sign}{int}.{f:0>digits$}")
                    }
                }
            })
    }

    fn number_literal() -> impl Strategy<Value = String> {
        prop_oneof![
            short_decimal(),
            any::<i64>().prop_map(|v| v.to_string()),
            any::<i32>().prop_map(|v| v.to_string()),
            any::<i8>().prop_map(|v| v.to_string()),
            any::<f64>()
                .prop_filter("finite", |v| v.is_finite())
                .prop_map(|v| v.to_string()),
            any::<f64>()
                .prop_filter("finite", |v| v.is_finite())
                .prop_map(|v| format!("{v:e}")),
            prop::sample::select(vec![
                "9223372036854775808",
                "-9223372036854775809",
                "99999999999999999999999",
                "2147483648",
                "-129",
                "-0",
                "0.0",
                "1e400",
                "-1e-400",
                "1E+2",
                "01",
                "1.",
                ".5",
                "-",
                "1e",
                "+1",
                "0x10",
            ])
            .prop_map(str::to_string),
        ]
    }

    fn value_literal() -> impl Strategy<Value = String> {
        prop_oneof![
            4 => string_literal(),
            3 => timestamp_literal(),
            4 => number_literal(),
            1 => prop::sample::select(vec![
                "true", "false", "null", "nul", "tru", "{\"a\":1}", "[1,\"x\"]", "[]", "{}",
                "\"\\x\"", "\"\\ud800\"", "\"\\ud800\\udc00\"",
            ])
            .prop_map(str::to_string),
        ]
    }

    fn key_literal() -> impl Strategy<Value = String> {
        prop::sample::select(vec![
            "s", "i", "i32", "i8", "f", "f32", "b", "d", "t", "tz", "tn", "x", "S", "\\u0073", "",
        ])
        .prop_map(|k| format!("\"{k}\""))
    }

    /// Records as text: members with arbitrary values, arbitrary whitespace, at times a
    /// stray or missing comma, one or two records per line, blank lines.
    fn records() -> impl Strategy<Value = String> {
        let ws = prop::sample::select(vec!["", "", "", " ", "\t", "\r\n", "  "]);
        let member = (key_literal(), ws.clone(), ws.clone(), value_literal())
            .prop_map(|(k, a, b, v)| format!("{k}{a}:{b}{v}"));
        let record = (
            prop::collection::vec(member, 0..6),
            prop::sample::select(vec![",", ",", ",", ",", ", ", ",,", " "]),
            ws.clone(),
        )
            .prop_map(|(members, sep, ws)| format!("{{{ws}{}{ws}}}", members.join(sep)));
        prop::collection::vec(
            (
                record,
                prop::sample::select(vec!["\n", "\n", "\r\n", " ", "\n\n"]),
            ),
            0..8,
        )
        .prop_map(|rs| rs.into_iter().map(|(r, end)| r + end).collect())
    }

    /// Members whose values mostly suit their columns, in every form the column may see:
    /// timestamps in arrow's forms (and not quite), numbers at the edges, escaped text.
    fn suited_records() -> impl Strategy<Value = String> {
        let member = prop_oneof![
            string_literal().prop_map(|v| format!("\"s\":{v}")),
            number_literal().prop_map(|v| format!("\"i\":{v}")),
            number_literal().prop_map(|v| format!("\"i32\":{v}")),
            number_literal().prop_map(|v| format!("\"i8\":{v}")),
            number_literal().prop_map(|v| format!("\"f\":{v}")),
            number_literal().prop_map(|v| format!("\"f32\":{v}")),
            number_literal().prop_map(|v| format!("\"s\":{v}")),
            timestamp_literal().prop_map(|v| format!("\"t\":{v}")),
            timestamp_literal().prop_map(|v| format!("\"d\":{v}")),
            timestamp_literal().prop_map(|v| format!("\"tz\":{v}")),
            timestamp_literal().prop_map(|v| format!("\"tn\":{v}")),
            value_literal().prop_map(|v| format!("\"x\":{v}")),
        ];
        prop::collection::vec(
            prop::collection::vec(member, 0..4).prop_map(|m| format!("{{{}}}", m.join(","))),
            1..4,
        )
        .prop_map(|rs| rs.join("\n"))
    }

    /// Records whose values all fit their columns: the fast path must take every one.
    fn typed_records() -> impl Strategy<Value = String> {
        let record = (
            prop::option::of(any::<String>()),
            prop::option::of(any::<i64>()),
            prop::option::of(any::<i32>()),
            prop::option::of(any::<f64>().prop_filter("finite", |v| v.is_finite())),
            prop::option::of(any::<bool>()),
            prop::option::of(-2_000_000_000_000_000i64..4_000_000_000_000_000),
        )
            .prop_map(|(s, i, i32, f, b, t)| {
                let t = t.map(|us| {
                    chrono::DateTime::from_timestamp_micros(us)
                        .unwrap()
                        .format("%Y-%m-%dT%H:%M:%S%.6fZ")
                        .to_string()
                });
                serde_json::json!({"s": s, "i": i, "i32": i32, "f": f, "b": b, "t": t}).to_string()
            });
        prop::collection::vec(record, 1..20).prop_map(|rs| rs.join("\n"))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4_000))]

        #[test]
        fn generated_json_gives_arrow_json_batches_or_is_declined(
            text in records(),
            batch in 1..5usize,
        ) {
            same_as_arrow(&schema(), text.as_bytes(), batch);
        }

        #[test]
        fn generated_members_suited_to_their_columns_give_arrow_json_batches_or_are_declined(
            text in suited_records(),
        ) {
            same_as_arrow(&schema(), text.as_bytes(), 2);
        }

        #[test]
        fn generated_timestamps_and_dates_read_as_arrow_reads_them(
            t in timestamp_literal(),
            column in prop::sample::select(vec!["t", "tz", "tn", "d"]),
        ) {
            same_as_arrow(&schema(), format!("{{\"{column}\":{t}}}").as_bytes(), 1);
        }

        #[test]
        fn short_decimals_read_as_lexical_core_reads_them(
            number in short_decimal(),
            after in prop::sample::select(vec!["", "}", ",\"a\":1}", " ", "e5", ".5", "-", "0", "x"]),
            padded in any::<bool>(),
        ) {
            // Padded, the eight-byte reads fit; without, a number at the text's end.
            let text = format!("{number}{after}{}", if padded { "        " } else { "" });
            // What arrow-json does: the grammar's number, then `lexical-core`.
            let mut d = Decoding {
                text: &text,
                b: text.as_bytes(),
                pos: 0,
                scratch: String::new(),
                last_date: None,
            };
            let want = d
                .number()
                .and_then(|(n, _)| lexical_core::parse::<f64>(n.as_bytes()).ok())
                .map(|v| (v.to_bits(), d.pos));
            d.pos = 0;
            let got = d.float64().map(|v| (v.to_bits(), d.pos));
            prop_assert_eq!(got, want, "{}", text);
        }

        #[test]
        fn eight_bytes_of_digits_read_as_one_at_a_time(
            bytes in prop::collection::vec(
                prop_oneof![3 => 0x2fu8..=0x3a, 1 => any::<u8>()],
                8..=12,
            ),
            at in 0usize..5,
        ) {
            let want = bytes.get(at..at + 8).map(|w| {
                let n = w.iter().take_while(|c| c.is_ascii_digit()).count();
                (n, w[..n].iter().fold(0u64, |v, &c| v * 10 + u64::from(c - b'0')))
            });
            prop_assert_eq!(digits8(&bytes, at), want, "{:?}", bytes);
        }

        #[test]
        fn generated_well_formed_records_are_all_taken(text in typed_records()) {
            prop_assert!(same_as_arrow(&schema(), text.as_bytes(), 7), "declined: {}", text);
        }
    }
}
