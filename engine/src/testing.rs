//! Helpers for tests and benchmarks (the engine's own and other crates'), behind the
//! `testing` feature: a job factory, bulk enqueue, waiting for a condition, worker settings
//! with short timings, and real PDFs made in memory.

use std::future::Future;
use std::time::{Duration, Instant};

use serde_json::Value;
use sqlx::postgres::PgPoolOptions;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use crate::queue::hooks::{HookResult, NoHooks, TerminalHooks, TerminalJob};
use crate::queue::policy::retry::RetryPolicy;
use crate::queue::worker::WorkerConfig;
use crate::{FailureKind, JobState};

/// A job as a test wants it, like River's `testfactory.Job`: every field has a plain default,
/// times are given as "seconds ago" (negative = in the future).
#[derive(Clone, Debug)]
pub struct JobOpts {
    pub owner_id: i64,
    pub state: JobState,
    pub payload: Value,
    pub cost: i32,
    pub attempts: i32,
    pub accepted_ago: f64,
    /// When it is (or was) due; defaults to `accepted_ago`.
    pub run_at_ago: Option<f64>,
    /// Defaults to unset; set it for done and failed jobs.
    pub finished_ago: Option<f64>,
    /// For failed jobs; defaults to `retries_exhausted` with a reason.
    pub failure: Option<(FailureKind, String)>,
    /// What its claim reserves from the token budget (and what fairness weighs it by).
    pub est_input_tokens: i64,
    /// In the bulk lane (a large document's); by default the urgent lane, as small work is.
    pub bulk: bool,
    /// Its deadline, in seconds from now, and its latest start (seconds from now).
    pub due_in: Option<(f64, f64)>,
}

impl Default for JobOpts {
    fn default() -> Self {
        JobOpts {
            owner_id: 1,
            state: JobState::Queued,
            payload: Value::Object(Default::default()),
            cost: 0,
            attempts: 0,
            accepted_ago: 0.0,
            run_at_ago: None,
            finished_ago: None,
            est_input_tokens: 0,
            failure: None,
            bulk: false,
            due_in: None,
        }
    }
}

/// Insert one job exactly as `opts` describes it (running jobs get a lease token, failed ones
/// a failure kind, as the schema demands). Returns its id.
pub async fn job(pool: &PgPool, opts: &JobOpts) -> Uuid {
    let failure = match (&opts.failure, opts.state) {
        (Some(failure), _) => Some(failure.clone()),
        (None, JobState::Failed) => Some((FailureKind::RetriesExhausted, "provider overloaded".to_string())),
        (None, _) => None,
    };
    let lease = (opts.state == JobState::Running).then(|| Uuid::from_u128(rand::random()));
    sqlx::query_scalar(
        "INSERT INTO jobs (owner_id, state, payload, cost, attempts, accepted_at, run_at, finished_at,
                           failure_kind, failure_reason, lease_token, lease_expires_at, est_input_tokens,
                           urgent, due_by, latest_start)
         VALUES ($1, $2, $3, $4, $5, now() - make_interval(secs => $6), now() - make_interval(secs => $7),
                 now() - make_interval(secs => $8), $9, $10, $11, CASE WHEN $11::uuid IS NULL THEN NULL
                 ELSE now() + interval '1 hour' END, $12, $13,
                 now() + make_interval(secs => $14), now() + make_interval(secs => $15))
         RETURNING id",
    )
    .bind(opts.owner_id)
    .bind(opts.state)
    .bind(&opts.payload)
    .bind(opts.cost)
    .bind(opts.attempts)
    .bind(opts.accepted_ago)
    .bind(opts.run_at_ago.unwrap_or(opts.accepted_ago))
    .bind(opts.finished_ago)
    .bind(failure.as_ref().map(|(kind, _)| *kind))
    .bind(failure.map(|(_, reason)| reason))
    .bind(lease)
    .bind(opts.est_input_tokens)
    .bind(!opts.bulk)
    .bind(opts.due_in.map(|d| d.0))
    .bind(opts.due_in.map(|d| d.1))
    .fetch_one(pool)
    .await
    .expect("insert a job")
}

/// A one-credit document of `user_id` whose content (and request) is `key`, as admission
/// takes it.
pub fn one_credit_document(user_id: i64, key: &str) -> crate::accounts::admission::Submission {
    crate::accounts::admission::Submission {
        price_by_size: None,
        lane: Default::default(),
        shared_document: None,
        cost: 1,
        est_input_tokens: 0,
        user_id,
        payload: serde_json::json!({ "document": { "name": format!("{key}.txt") } }),
        content_key: key.to_string(),
        client_key: None,
        fingerprint: key.to_string(),
    }
}

/// A second pool on the same database with room for `connections` (test pools are small).
pub async fn wider_pool(pool: &PgPool, connections: u32) -> PgPool {
    PgPoolOptions::new()
        .max_connections(connections)
        .connect_with(pool.connect_options().as_ref().clone())
        .await
        .expect("a wider pool")
}

/// Enqueue `n` jobs for `owner` in one transaction; returns their ids in order.
pub async fn enqueue_many(pool: &PgPool, owner: i64, n: usize) -> Vec<Uuid> {
    sqlx::query_scalar(
        "INSERT INTO jobs (owner_id, payload, accepted_at, run_at)
         SELECT $1, jsonb_build_object('n', g), clock_timestamp(), clock_timestamp()
         FROM generate_series(1, $2) g RETURNING id",
    )
    .bind(owner)
    .bind(n as i32)
    .fetch_all(pool)
    .await
    .expect("enqueue")
}

/// How many jobs are in `state`.
pub async fn count_in_state(pool: &PgPool, state: JobState) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM jobs WHERE state = $1").bind(state).fetch_one(pool).await.expect("count")
}

/// Poll `check` every 20 ms until it is true or `timeout` passes; returns whether it held.
pub async fn wait_for<F, Fut>(timeout: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if check().await {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Worker settings with timings short enough for tests.
pub fn fast_worker(name: &str, concurrency: usize) -> WorkerConfig {
    WorkerConfig {
        name: name.to_string(),
        role: "worker",
        concurrency,
        lease: Duration::from_secs(2),
        heartbeat: Duration::from_millis(400),
        poll_interval: Duration::from_millis(200),
        shutdown_timeout: Duration::from_secs(5),
        fetched_ahead_wait: crate::queue::worker::FETCHED_AHEAD_WAIT,
        attempt_deadline: Duration::from_secs(30),
        deadline_per_100k_tokens: Duration::ZERO,
        policy: RetryPolicy {
            max_attempts: 3,
            delays: vec![Duration::from_millis(200), Duration::from_millis(400)],
            max_delay: Duration::from_secs(2),
            max_jitter: Duration::ZERO,
            quota_hold: Duration::from_secs(1),
            ..RetryPolicy::default()
        },
    }
}

/// Blob storage in a fresh temporary folder, removed when dropped.
pub struct TempBlobs {
    pub blobs: crate::documents::Blobs,
    pub dir: std::path::PathBuf,
}

impl TempBlobs {
    /// A fresh folder named after `name` and this process.
    pub fn new(name: &str) -> TempBlobs {
        let dir = std::env::temp_dir().join(format!("sluice-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        TempBlobs { blobs: crate::documents::Blobs::local(&dir).expect("a blob folder"), dir }
    }
}

impl Drop for TempBlobs {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A real one-page PDF whose text layer holds `lines` (Helvetica), made with lopdf.
pub fn pdf_with_text(lines: &[&str]) -> Vec<u8> {
    build_pdf(text_operators(lines), false)
}

/// The same with its page's text compressed (FlateDecode), as most real PDFs are: far more
/// text per byte.
pub fn pdf_with_compressed_text(lines: &[&str]) -> Vec<u8> {
    build_pdf_with(text_operators(lines), false, true)
}

fn text_operators(lines: &[&str]) -> Vec<u8> {
    let mut ops = vec!["BT".to_string(), "/F1 12 Tf".into(), "72 720 Td".into(), "14 TL".into()];
    for line in lines {
        let escaped = line.replace('\\', "\\\\").replace('(', "\\(").replace(')', "\\)");
        ops.push(format!("({escaped}) Tj T*"));
    }
    ops.push("ET".into());
    ops.join("\n").into_bytes()
}

/// A PDF with a page that has no text (a filled rectangle, as a scan would be an image).
pub fn pdf_without_text() -> Vec<u8> {
    build_pdf(b"0.5 g 72 72 300 300 re f".to_vec(), false)
}

/// A PDF whose trailer names an encryption dictionary (as password-protected files do).
pub fn encrypted_pdf() -> Vec<u8> {
    build_pdf(b"BT /F1 12 Tf 72 720 Td (secret) Tj ET".to_vec(), true)
}

fn build_pdf(content: Vec<u8>, encrypted: bool) -> Vec<u8> {
    build_pdf_with(content, encrypted, false)
}

fn build_pdf_with(content: Vec<u8>, encrypted: bool, compressed: bool) -> Vec<u8> {
    use lopdf::{dictionary, Document, Object, Stream};
    let mut doc = Document::with_version("1.5");
    let pages_id = doc.new_object_id();
    let font_id = doc.add_object(dictionary! { "Type" => "Font", "Subtype" => "Type1", "BaseFont" => "Helvetica" });
    let resources_id = doc.add_object(dictionary! { "Font" => dictionary! { "F1" => font_id } });
    let mut content = Stream::new(dictionary! {}, content);
    if compressed {
        content.compress().expect("compress the page");
    }
    let content_id = doc.add_object(content);
    let page_id = doc.add_object(dictionary! {
        "Type" => "Page", "Parent" => pages_id, "Contents" => content_id, "Resources" => resources_id,
        "MediaBox" => vec![0.into(), 0.into(), 612.into(), 792.into()],
    });
    doc.objects.insert(
        pages_id,
        Object::Dictionary(dictionary! { "Type" => "Pages", "Kids" => vec![page_id.into()], "Count" => 1 }),
    );
    let catalog_id = doc.add_object(dictionary! { "Type" => "Catalog", "Pages" => pages_id });
    doc.trailer.set("Root", catalog_id);
    if encrypted {
        let encrypt_id = doc.add_object(dictionary! {
            "Filter" => "Standard", "V" => 1, "R" => 2, "P" => -44,
            "O" => Object::string_literal(vec![0u8; 32]), "U" => Object::string_literal(vec![0u8; 32]),
        });
        doc.trailer.set("Encrypt", encrypt_id);
    }
    let mut out = Vec::new();
    doc.save_to(&mut out).expect("write the PDF");
    out
}

/// A PDF written byte by byte from its objects (1-based, in order), with a correct xref table.
/// Hostile files are built this way, so the test process never parses them itself.
pub fn raw_pdf(objects: &[Vec<u8>]) -> Vec<u8> {
    let mut out = b"%PDF-1.5\n".to_vec();
    let mut offsets = Vec::with_capacity(objects.len());
    for (i, body) in objects.iter().enumerate() {
        offsets.push(out.len());
        out.extend_from_slice(format!("{} 0 obj\n", i + 1).as_bytes());
        out.extend_from_slice(body);
        out.extend_from_slice(b"\nendobj\n");
    }
    let xref = out.len();
    out.extend_from_slice(format!("xref\n0 {}\n0000000000 65535 f \n", objects.len() + 1).as_bytes());
    for offset in offsets {
        out.extend_from_slice(format!("{offset:010} 00000 n \n").as_bytes());
    }
    out.extend_from_slice(
        format!("trailer\n<< /Size {} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n", objects.len() + 1).as_bytes(),
    );
    out
}

/// Objects 1 (catalog), 2 (pages) and 3 (the one page, drawing content object 4 with
/// `resources`), for the hostile files below.
fn one_page(resources: &str) -> Vec<Vec<u8>> {
    vec![
        b"<< /Type /Catalog /Pages 2 0 R >>".to_vec(),
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>".to_vec(),
        format!("<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R /Resources {resources} >>")
            .into_bytes(),
    ]
}

fn stream(dictionary: &str, data: &[u8]) -> Vec<u8> {
    let mut out = format!("<< {dictionary} /Length {} >>\nstream\n", data.len()).into_bytes();
    out.extend_from_slice(data);
    out.extend_from_slice(b"\nendstream");
    out
}

/// A page that draws form XObject 5, which draws itself: naive readers recurse for ever.
pub fn pdf_self_drawing_xobject() -> Vec<u8> {
    let mut objects = one_page("<< /XObject << /X 5 0 R >> >>");
    objects.push(stream("", b"/X Do"));
    objects.push(stream(
        "/Type /XObject /Subtype /Form /BBox [0 0 10 10] /Resources << /XObject << /X 5 0 R >> >>",
        b"BT /F1 12 Tf (loop) Tj ET /X Do",
    ));
    raw_pdf(&objects)
}

/// A page whose content stream nests `depth` arrays: `[[[[...]]]]`.
pub fn pdf_deeply_nested(depth: usize) -> Vec<u8> {
    let mut objects = one_page("<< >>");
    let mut content = vec![b'['; depth];
    content.extend(std::iter::repeat_n(b']', depth));
    content.extend_from_slice(b" BT (x) Tj ET");
    objects.push(stream("", &content));
    raw_pdf(&objects)
}

/// A page whose `FlateDecode` content stream inflates to about `inflated` bytes of zeros
/// from a few thousandth of that (a decompression bomb).
pub fn pdf_decompression_bomb(inflated: usize) -> Vec<u8> {
    let mut objects = one_page("<< >>");
    objects.push(stream("/Filter /FlateDecode", &zlib_zeros(inflated)));
    raw_pdf(&objects)
}

/// A zlib stream of about `n` zeros: one literal, then 258-byte back-references in one
/// fixed-Huffman block (13 bits per 258 bytes).
fn zlib_zeros(n: usize) -> Vec<u8> {
    struct Bits {
        out: Vec<u8>,
        acc: u64,
        count: u32,
    }
    impl Bits {
        fn put(&mut self, value: u64, bits: u32) {
            self.acc |= value << self.count;
            self.count += bits;
            while self.count >= 8 {
                self.out.push(self.acc as u8);
                self.acc >>= 8;
                self.count -= 8;
            }
        }
        /// Huffman codes go most significant bit first.
        fn code(&mut self, code: u64, bits: u32) {
            let reversed = (0..bits).fold(0, |r, i| (r << 1) | ((code >> i) & 1));
            self.put(reversed, bits);
        }
    }
    let runs = n / 258;
    let mut bits = Bits { out: vec![0x78, 0x01], acc: 0, count: 0 };
    bits.put(1, 1); // the final block
    bits.put(1, 2); // fixed Huffman codes
    bits.code(0x30, 8); // literal 0
    for _ in 0..runs {
        bits.code(0xC5, 8); // length 258
        bits.code(0, 5); // distance 1
    }
    bits.code(0, 7); // end of block
    if bits.count > 0 {
        bits.put(0, 8 - bits.count);
    }
    let total = 1 + 258 * runs as u64;
    let adler = ((total % 65521) << 16) | 1;
    bits.out.extend_from_slice(&(adler as u32).to_be_bytes());
    bits.out
}

/// A zip of these entries, deflated, as office suites write them (the zip crate's writer).
pub fn zip_of(entries: &[(&str, &[u8])]) -> Vec<u8> {
    use std::io::Write;
    let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    for (name, bytes) in entries {
        let options = zip::write::SimpleFileOptions::default().compression_method(if *name == "mimetype" {
            zip::CompressionMethod::Stored
        } else {
            zip::CompressionMethod::Deflated
        });
        zip.start_file(*name, options).expect("a zip entry");
        zip.write_all(bytes).expect("writing to memory");
    }
    zip.finish().expect("a zip").into_inner()
}

/// A Word file whose body is `body` (WordprocessingML inside `<w:body>`).
pub fn docx_of(body: &str) -> Vec<u8> {
    let document = format!(
        r#"<?xml version="1.0" encoding="UTF-8" standalone="yes"?><w:document xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main"><w:body>{body}</w:body></w:document>"#
    );
    zip_of(&[
        ("[Content_Types].xml", br#"<?xml version="1.0"?><Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types"><Override PartName="/word/document.xml" ContentType="application/vnd.openxmlformats-officedocument.wordprocessingml.document.main+xml"/></Types>"#),
        ("_rels/.rels", br#"<?xml version="1.0"?><Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships"><Relationship Id="rId1" Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/officeDocument" Target="word/document.xml"/></Relationships>"#),
        ("word/document.xml", document.as_bytes()),
    ])
}

/// A Word file of these paragraphs, each one run.
pub fn docx_with_paragraphs(paragraphs: &[&str]) -> Vec<u8> {
    let body: String =
        paragraphs.iter().map(|p| format!("<w:p><w:r><w:t xml:space=\"preserve\">{p}</w:t></w:r></w:p>")).collect();
    docx_of(&body)
}

/// An OpenDocument text whose body is `body` (inside `<office:text>`).
pub fn odt_of(body: &str) -> Vec<u8> {
    let content = format!(
        r#"<?xml version="1.0" encoding="UTF-8"?><office:document-content xmlns:office="urn:oasis:names:tc:opendocument:xmlns:office:1.0" xmlns:text="urn:oasis:names:tc:opendocument:xmlns:text:1.0"><office:body><office:text>{body}</office:text></office:body></office:document-content>"#
    );
    zip_of(&[
        ("mimetype", b"application/vnd.oasis.opendocument.text"),
        ("META-INF/manifest.xml", br#"<?xml version="1.0"?><manifest:manifest xmlns:manifest="urn:oasis:names:tc:opendocument:xmlns:manifest:1.0"/>"#),
        ("content.xml", content.as_bytes()),
    ])
}

/// A Word file whose `word/document.xml` inflates to about `inflated` bytes of zeros from a
/// few thousandth of that, while its headers declare 1 KiB (a zip bomb that lies).
pub fn docx_zip_bomb(inflated: usize) -> Vec<u8> {
    let zlib = zlib_zeros(inflated);
    let deflated = &zlib[2..zlib.len() - 4];
    let name = b"word/document.xml";
    let declared: u32 = 1024;
    let mut out = Vec::new();
    let le16 = |v: u16| v.to_le_bytes();
    let le32 = |v: u32| v.to_le_bytes();
    // Local header, then the data.
    out.extend_from_slice(b"PK\x03\x04");
    out.extend_from_slice(&le16(20));
    out.extend_from_slice(&le16(0));
    out.extend_from_slice(&le16(8)); // deflated
    out.extend_from_slice(&[0; 4]); // time and date
    out.extend_from_slice(&le32(0)); // crc (never reached)
    out.extend_from_slice(&le32(deflated.len() as u32));
    out.extend_from_slice(&le32(declared));
    out.extend_from_slice(&le16(name.len() as u16));
    out.extend_from_slice(&le16(0));
    out.extend_from_slice(name);
    out.extend_from_slice(deflated);
    // The central directory, then its end.
    let central = out.len() as u32;
    out.extend_from_slice(b"PK\x01\x02");
    out.extend_from_slice(&le16(20));
    out.extend_from_slice(&le16(20));
    out.extend_from_slice(&le16(0));
    out.extend_from_slice(&le16(8));
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(&le32(0));
    out.extend_from_slice(&le32(deflated.len() as u32));
    out.extend_from_slice(&le32(declared));
    out.extend_from_slice(&le16(name.len() as u16));
    out.extend_from_slice(&[0; 12]); // extra, comment, disk, attributes
    out.extend_from_slice(&le32(0)); // the local header's offset
    out.extend_from_slice(name);
    let central_len = out.len() as u32 - central;
    out.extend_from_slice(b"PK\x05\x06");
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(&le16(1));
    out.extend_from_slice(&le16(1));
    out.extend_from_slice(&le32(central_len));
    out.extend_from_slice(&le32(central));
    out.extend_from_slice(&le16(0));
    out
}

/// A readable one-page PDF whose xref table points at the wrong places.
pub fn pdf_with_damaged_xref() -> Vec<u8> {
    let mut pdf = pdf_with_text(&["Damaged but honest."]);
    let xref = pdf.windows(5).rposition(|w| w == b"xref\n").expect("an xref table");
    for b in &mut pdf[xref + 5..] {
        if b.is_ascii_digit() {
            *b = b'7';
        }
    }
    pdf
}

/// An honest PDF of `pages` pages, each with a line of text.
pub fn pdf_with_pages(pages: usize) -> Vec<u8> {
    use lopdf::{dictionary, Document, Object, Stream};
    let mut doc = Document::with_version("1.5");
    let pages_id = doc.new_object_id();
    let font_id = doc.add_object(dictionary! { "Type" => "Font", "Subtype" => "Type1", "BaseFont" => "Helvetica" });
    let resources_id = doc.add_object(dictionary! { "Font" => dictionary! { "F1" => font_id } });
    let kids: Vec<Object> = (0..pages)
        .map(|n| {
            let text = format!("BT /F1 12 Tf 72 720 Td (Page {n} says hello.) Tj ET");
            let content_id = doc.add_object(Stream::new(dictionary! {}, text.into_bytes()));
            letter_page(&mut doc, pages_id, content_id, resources_id.into())
        })
        .collect();
    finish_pdf(doc, pages_id, kids)
}

/// A letter page of the page tree `pages_id`, showing `content_id` with `resources`.
fn letter_page(
    doc: &mut lopdf::Document,
    pages_id: lopdf::ObjectId,
    content_id: lopdf::ObjectId,
    resources: lopdf::Object,
) -> lopdf::Object {
    use lopdf::dictionary;
    doc.add_object(dictionary! {
        "Type" => "Page", "Parent" => pages_id, "Contents" => content_id, "Resources" => resources,
        "MediaBox" => vec![0.into(), 0.into(), 612.into(), 792.into()],
    })
    .into()
}

/// The document with its page tree (`kids` under `pages_id`) and catalog, written out.
fn finish_pdf(mut doc: lopdf::Document, pages_id: lopdf::ObjectId, kids: Vec<lopdf::Object>) -> Vec<u8> {
    use lopdf::{dictionary, Object};
    let count = kids.len() as i64;
    doc.objects
        .insert(pages_id, Object::Dictionary(dictionary! { "Type" => "Pages", "Kids" => kids, "Count" => count }));
    let catalog_id = doc.add_object(dictionary! { "Type" => "Catalog", "Pages" => pages_id });
    doc.trailer.set("Root", catalog_id);
    let mut out = Vec::new();
    doc.save_to(&mut out).expect("write the PDF");
    out
}

pub use crate::documents::images::tiff_of;

/// The most this process has had resident so far (VmHWM), in MiB.
pub fn peak_rss_mib() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).expect("VmHWM");
    line.split_whitespace().nth(1).and_then(|kb| kb.parse::<usize>().ok()).expect("a number") / 1024
}

/// Hooks for tests that run `.0` when a job is done and nothing on its other transitions.
#[derive(Clone, Copy)]
pub struct OnDone(pub for<'a> fn(&'a mut PgConnection, &'a TerminalJob) -> HookResult<'a>);

impl TerminalHooks for OnDone {
    fn on_done<'a>(&'a self, tx: &'a mut PgConnection, job: &'a TerminalJob) -> HookResult<'a> {
        (self.0)(tx, job)
    }
    fn on_failed<'a>(&'a self, tx: &'a mut PgConnection, job: &'a TerminalJob) -> HookResult<'a> {
        NoHooks.on_failed(tx, job)
    }
    fn on_replayed<'a>(&'a self, tx: &'a mut PgConnection, job: &'a TerminalJob) -> HookResult<'a> {
        NoHooks.on_replayed(tx, job)
    }
    fn on_canceled<'a>(&'a self, tx: &'a mut PgConnection, job: &'a TerminalJob) -> HookResult<'a> {
        NoHooks.on_canceled(tx, job)
    }
}

/// Done hooks that log every job written as done, in the transition's own transaction, to the
/// table [`log_done_writes`] makes. A job's row keeps one success, which a second write would
/// overwrite: the log is what shows a result recorded twice.
pub const LOG_DONE: OnDone = OnDone(log_done_write);

/// [`LOG_DONE`]'s one write.
pub fn log_done_write<'a>(tx: &'a mut PgConnection, job: &'a TerminalJob) -> HookResult<'a> {
    Box::pin(async move {
        sqlx::query("INSERT INTO test_done_writes (job_id) VALUES ($1)").bind(job.id).execute(tx).await?;
        Ok(())
    })
}

/// Make the table [`LOG_DONE`] writes to (before any worker with those hooks starts).
pub async fn log_done_writes(pool: &PgPool) {
    sqlx::query("CREATE TABLE IF NOT EXISTS test_done_writes (job_id uuid NOT NULL)").execute(pool).await.unwrap();
}

/// Jobs written as done more than once (a result recorded twice) by workers with [`LOG_DONE`]
/// hooks, or with two successful attempts in their history: 0 when every job was done exactly
/// once, whatever crashed on the way. Fails if the log was never made, so the check cannot pass
/// for want of it.
pub async fn jobs_done_twice(pool: &PgPool) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT job_id FROM test_done_writes GROUP BY job_id HAVING count(*) > 1
                               UNION
                               SELECT job_id FROM attempt_history WHERE outcome = 'succeeded'
                               GROUP BY job_id HAVING count(*) > 1) d",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

/// A PDF page for [`pdf_of_pages`]: a text layer, or a scan of the same lines (no text layer).
#[derive(Clone, Debug)]
pub enum TestPage {
    Text(Vec<String>),
    Scanned(Vec<String>),
}

/// Lines in Helvetica 16 on a letter page, as a content stream (Latin-1 text in the font's
/// WinAnsi encoding, so "Kündigung" shows as such).
fn large_text_operators(lines: &[String]) -> Vec<u8> {
    let mut ops: Vec<u8> = b"BT /F1 16 Tf 72 700 Td 24 TL\n".to_vec();
    for line in lines {
        let escaped = line.replace('\\', "\\\\").replace('(', "\\(").replace(')', "\\)");
        ops.push(b'(');
        ops.extend(escaped.chars().map(|c| u8::try_from(u32::from(c)).unwrap_or(b'?')));
        ops.extend_from_slice(b") Tj T*\n");
    }
    ops.extend_from_slice(b"ET");
    ops
}

/// `lines` of each page rendered as a scanner would: gray JPEGs at 150 DPI, by poppler's
/// `pdftoppm` (the test machine's, as the server's OCR uses).
pub fn scans_of(pages: &[Vec<String>]) -> Vec<Vec<u8>> {
    let texts: Vec<TestPage> = pages.iter().cloned().map(TestPage::Text).collect();
    let pdf = pdf_of_pages(&texts);
    let dir = std::env::temp_dir().join(format!("sluice-scan-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).expect("a temporary folder");
    std::fs::write(dir.join("text.pdf"), &pdf).expect("write the text PDF");
    let rendered = std::process::Command::new("pdftoppm")
        .args(["-r", "150", "-gray", "-jpeg", "-jpegopt", "quality=60"])
        .arg(dir.join("text.pdf"))
        .arg(dir.join("page"))
        .status()
        .expect("pdftoppm runs (apt-get install poppler-utils)");
    assert!(rendered.success(), "pdftoppm rendered the pages");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "jpg"))
        .collect();
    files.sort();
    let scans = files.iter().map(|f| std::fs::read(f).unwrap()).collect();
    let _ = std::fs::remove_dir_all(&dir);
    scans
}

/// A PNG photo of a page holding `lines` (rendered by `pdftoppm`).
pub fn png_of_lines(lines: &[&str]) -> Vec<u8> {
    let lines: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
    let pdf = pdf_of_pages(&[TestPage::Text(lines)]);
    let mut child = std::process::Command::new("pdftoppm")
        .args(["-r", "150", "-gray", "-png", "-singlefile", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("pdftoppm runs");
    use std::io::Write;
    child.stdin.take().unwrap().write_all(&pdf).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    out.stdout
}

/// A PDF of letter pages, each with a text layer or a scan of its lines (an image, no text).
pub fn pdf_of_pages(pages: &[TestPage]) -> Vec<u8> {
    use lopdf::{dictionary, Document, Object, Stream};
    let scanned: Vec<Vec<String>> = pages
        .iter()
        .filter_map(|p| match p {
            TestPage::Scanned(lines) => Some(lines.clone()),
            TestPage::Text(_) => None,
        })
        .collect();
    let mut scans = if scanned.is_empty() { Vec::new() } else { scans_of(&scanned) }.into_iter();
    let mut doc = Document::with_version("1.5");
    let pages_id = doc.new_object_id();
    let font_id = doc.add_object(dictionary! {
        "Type" => "Font", "Subtype" => "Type1", "BaseFont" => "Helvetica", "Encoding" => "WinAnsiEncoding",
    });
    let kids: Vec<Object> = pages
        .iter()
        .map(|page| {
            let (content, resources) = match page {
                TestPage::Text(lines) => {
                    (large_text_operators(lines), dictionary! { "Font" => dictionary! { "F1" => font_id } })
                }
                TestPage::Scanned(_) => {
                    let jpeg = scans.next().expect("a scan for each scanned page");
                    let size = crate::documents::images::measure(&jpeg, crate::documents::images::ImageBounds::DEFAULT)
                        .expect("pdftoppm's JPEG measures");
                    let image = doc.add_object(Stream::new(
                        dictionary! {
                            "Type" => "XObject", "Subtype" => "Image", "Width" => size.width as i64,
                            "Height" => size.height as i64, "ColorSpace" => "DeviceRGB",
                            "BitsPerComponent" => 8, "Filter" => "DCTDecode",
                        },
                        jpeg,
                    ));
                    (
                        b"q 612 0 0 792 0 0 cm /Im0 Do Q".to_vec(),
                        dictionary! { "XObject" => dictionary! { "Im0" => image } },
                    )
                }
            };
            let content_id = doc.add_object(Stream::new(dictionary! {}, content));
            letter_page(&mut doc, pages_id, content_id, resources.into())
        })
        .collect();
    finish_pdf(doc, pages_id, kids)
}

/// A page that takes its renderer many seconds: an 80,000 × 80,000 pixel image (800 MB of
/// pixels in a 5 MB stream, a pixel bomb) between two honest scanned pages. Text extraction
/// never decodes images, so only the OCR of that page meets it.
pub fn pdf_with_a_page_that_never_finishes(before: &[&str], after: &[&str]) -> Vec<u8> {
    let scans =
        scans_of(&[before.iter().map(|l| l.to_string()).collect(), after.iter().map(|l| l.to_string()).collect()]);
    let image = |dictionary: String, data: &[u8]| {
        let mut body = format!("<< {dictionary} /Length {} >>\nstream\n", data.len()).into_bytes();
        body.extend_from_slice(data);
        body.extend_from_slice(b"\nendstream");
        body
    };
    let scan = |jpeg: &[u8]| {
        let size = crate::documents::images::measure(jpeg, crate::documents::images::ImageBounds::DEFAULT).unwrap();
        let dictionary = format!(
            "/Type /XObject /Subtype /Image /Width {} /Height {} /ColorSpace /DeviceRGB /BitsPerComponent 8 /Filter /DCTDecode",
            size.width, size.height
        );
        image(dictionary, jpeg)
    };
    const SIDE: u64 = 80_000;
    let bomb = image(
        format!("/Type /XObject /Subtype /Image /Width {SIDE} /Height {SIDE} /ColorSpace /DeviceGray /BitsPerComponent 1 /Filter /FlateDecode"),
        &zlib_of_zeros(SIDE * SIDE / 8),
    );
    let page = |contents: usize, image: usize| {
        format!("<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents {contents} 0 R /Resources << /XObject << /Im0 {image} 0 R >> >> >>")
            .into_bytes()
    };
    let draw = b"q 612 0 0 792 0 0 cm /Im0 Do Q";
    raw_pdf(&[
        b"<< /Type /Catalog /Pages 2 0 R >>".to_vec(),
        b"<< /Type /Pages /Kids [3 0 R 4 0 R 5 0 R] /Count 3 >>".to_vec(),
        page(6, 7),
        page(6, 8),
        page(6, 9),
        stream("", draw),
        scan(&scans[0]),
        bomb,
        scan(&scans[1]),
    ])
}

/// A PDF of `pages` pages, each showing the same `side` × `side` pixel image (see
/// [`pdf_with_a_page_that_never_finishes`]): a document of bombs.
pub fn pdf_of_bombs(pages: usize, side: u64) -> Vec<u8> {
    let data = zlib_of_zeros(side * side / 8);
    let mut bomb = format!(
        "<< /Type /XObject /Subtype /Image /Width {side} /Height {side} /ColorSpace /DeviceGray /BitsPerComponent 1 /Filter /FlateDecode /Length {} >>\nstream\n",
        data.len()
    )
    .into_bytes();
    bomb.extend_from_slice(&data);
    bomb.extend_from_slice(b"\nendstream");
    // 1 catalog, 2 pages, 3 the content, 4 the image, 5.. the pages.
    let kids: Vec<String> = (0..pages).map(|i| format!("{} 0 R", 5 + i)).collect();
    let mut objects = vec![
        b"<< /Type /Catalog /Pages 2 0 R >>".to_vec(),
        format!("<< /Type /Pages /Kids [{}] /Count {pages} >>", kids.join(" ")).into_bytes(),
        stream("", b"q 612 0 0 792 0 0 cm /Im0 Do Q"),
        bomb,
    ];
    for _ in 0..pages {
        objects.push(
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 3 0 R /Resources << /XObject << /Im0 4 0 R >> >> >>"
                .to_vec(),
        );
    }
    raw_pdf(&objects)
}

/// A zlib stream of at least `length` zero bytes, written by hand (one fixed-Huffman block:
/// a zero, then copies of 258 bytes from one back), about 5 MB a GB, made in no time.
pub fn zlib_of_zeros(length: u64) -> Vec<u8> {
    struct Bits {
        out: Vec<u8>,
        byte: u8,
        used: u8,
    }
    impl Bits {
        /// `count` bits of `value`, least significant first (deflate's header bits).
        fn push(&mut self, value: u32, count: u8) {
            for i in 0..count {
                self.byte |= (((value >> i) & 1) as u8) << self.used;
                self.used += 1;
                if self.used == 8 {
                    self.out.push(self.byte);
                    (self.byte, self.used) = (0, 0);
                }
            }
        }
        /// A Huffman code of `count` bits, most significant first.
        fn code(&mut self, code: u32, count: u8) {
            for i in (0..count).rev() {
                self.push((code >> i) & 1, 1);
            }
        }
    }
    let copies = length.saturating_sub(1).div_ceil(258);
    let mut bits = Bits { out: vec![0x78, 0x01], byte: 0, used: 0 };
    bits.push(1, 1); // the final block
    bits.push(1, 2); // fixed Huffman codes
    bits.code(0x30, 8); // the literal 0
    for _ in 0..copies {
        bits.code(0b1100_0101, 8); // length 258 (code 285)
        bits.code(0, 5); // distance 1
    }
    bits.code(0, 7); // end of block
    if bits.used > 0 {
        bits.out.push(bits.byte);
    }
    let total = 1 + copies * 258;
    let adler = ((total % 65_521) << 16) | 1;
    bits.out.extend_from_slice(&(adler as u32).to_be_bytes());
    bits.out
}
