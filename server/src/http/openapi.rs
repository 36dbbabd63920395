//! The REST API's contract: the OpenAPI document's own parts (its description, its security
//! schemes) and the schema types that only describe bodies. The handlers (`jobs`) use these;
//! `api` puts handlers and contract together. Nothing here knows a route.

use utoipa::openapi::schema::{AnyOfBuilder, KnownFormat, Object, ObjectBuilder, Schema, SchemaFormat, Type};
use utoipa::openapi::security::{ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi, ToSchema};

/// Every error answer's body: a machine-readable code, the words to show, and the code's
/// details (e.g. `balance` and `cost` with `out_of_credits`, `retry_after_secs` where waiting
/// helps, also sent as `Retry-After`).
#[derive(ToSchema)]
#[allow(dead_code)] // Only its schema is used; the body is AppError's serialisation.
pub struct ErrorBody {
    /// The error's code, e.g. `out_of_credits`, `too_many_in_flight`, `not_found`.
    #[schema(pattern = "^[a-z_]+$")]
    error: String,
    /// What went wrong, in words a person can act on.
    message: String,
}

/// The upload form (`multipart/form-data`): the document, what to do with it, and where to
/// report its end. Fields other than these are refused (422).
#[derive(ToSchema, serde::Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // Only its schema is used; the form is read field by field.
pub struct UploadForm {
    #[schema(schema_with = document_file)]
    file: String,
    #[schema(schema_with = presets)]
    preset: Option<String>,
    /// A translation's target language (English when left out).
    #[schema(schema_with = language)]
    language: Option<String>,
    #[schema(schema_with = callback_url)]
    callback_url: Option<String>,
    /// When it is needed: RFC 3339 with its zone, still to come and at most a year ahead.
    /// Within fairness, work near its deadline is taken first, and the operator is alerted
    /// while there is still time to act; the estimate says whether it can be met.
    #[schema(format = DateTime)]
    due_by: Option<String>,
    /// Put it in the urgent lane, whose share of the gate large documents never take (small
    /// documents are there anyway): honoured up to four times the operator's size for small
    /// documents; a larger one stays in the bulk lane.
    urgent: Option<bool>,
    /// `economy`: done through the provider's batch API within the operator's window ("by
    /// tomorrow"), at the operator's discount (half the credits by default); the job waits
    /// "in the provider's batch" meanwhile. 422 where the provider has no batch API, and with
    /// `urgent` or `due_by`. `standard` when left out.
    #[schema(schema_with = lanes)]
    lane: Option<String>,
    /// A translation into several languages, comma-separated (up to 10, none twice; instead of
    /// `language`): each is its own job, priced and admitted on its own; the answer's `also`
    /// names the jobs after the first (or why one was refused).
    #[schema(min_length = 1, max_length = 420)]
    languages: Option<String>,
    /// A translation's glossary in DeepL's format: `term,translation` (or tab-separated) a
    /// line, at most 1,000 entries and 60 KB. Each part's prompt carries the entries whose
    /// terms it has; an answer leaving one out is asked again once, then reported on the job.
    #[schema(max_length = 61440)]
    glossary: Option<String>,
    /// A glossary saved in your account (`PUT /api/v1/glossaries/{name}`), used under the
    /// pasted one's entries; an unknown name is 422.
    #[schema(min_length = 1, max_length = 60)]
    glossary_name: Option<String>,
    /// Save the pasted glossary in your account under this name.
    #[schema(min_length = 1, max_length = 60)]
    save_glossary_as: Option<String>,
    /// How a translation addresses its reader.
    #[schema(schema_with = formality)]
    formality: Option<String>,
}

/// The lane an upload asks for.
fn lanes() -> Object {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .enum_values(Some(["standard", "economy"]))
        .description(Some("The standard lane, or the economy lane: by tomorrow, at the operator's discount."))
        .build()
}

/// A translation's formality.
fn formality() -> Object {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .enum_values(Some(["formal", "informal", "as_source"]))
        .description(Some("How a translation addresses its reader (as the source does when left out)."))
        .build()
}

/// The document: PDF, Word (.docx), OpenDocument text (.odt), a web page, Markdown or plain
/// text (UTF-8, UTF-16 with a BOM, or Latin-1). Its bytes decide its type, not its name or
/// media type: other bytes are 415.
fn document_file() -> Schema {
    let text = ObjectBuilder::new()
        .schema_type(Type::String)
        .content_media_type("text/plain")
        .min_length(Some(1))
        .pattern(Some(TEXT_PATTERN))
        .description(Some("Plain text or Markdown: printable, with something besides blanks, no markup."))
        .build();
    let binary = ObjectBuilder::new()
        .schema_type(Type::String)
        .format(Some(SchemaFormat::KnownFormat(KnownFormat::Binary)))
        .content_media_type("application/octet-stream")
        .description(Some("A PDF, Word (.docx), OpenDocument text (.odt) or web page (.html) file."))
        .build();
    AnyOfBuilder::new()
        .item(text)
        .item(binary)
        .description(Some(
            "The document: PDF, Word (.docx), OpenDocument text (.odt), a web page, Markdown or plain text \
             (UTF-8, UTF-16 with a BOM, or Latin-1), up to the server's size limit. Its bytes decide its type, \
             not its name or media type: other bytes are 415; an empty file is 422.",
        ))
        .into()
}

/// A text document as the upload takes it: printable characters (tabs and line breaks too),
/// at least one that is not blank, and no `<` (markup inside text is refused).
pub const TEXT_PATTERN: &str =
    r"^[^<\x00-\x08\x0b\x0e-\x1f\x7f-\x9f]*[^\s<\x00-\x1f\x7f-\x9f][^<\x00-\x08\x0b\x0e-\x1f\x7f-\x9f]*$";

/// What to do with a document.
pub fn presets() -> Object {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .enum_values(Some(engine::Preset::ALL.map(|p| p.as_str())))
        .description(Some("What to do (summarize when left out)."))
        .build()
}

/// A language name: 1 to 40 characters, no control characters, not blank at either end.
pub fn language() -> Object {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .min_length(Some(1))
        .max_length(Some(40))
        .pattern(Some(LANGUAGE_PATTERN))
        .description(Some("The target language, by name, e.g. \"German\"."))
        .build()
}

/// `schema`, also taking null (a body's "the earlier job's"): a schema of its own replaces the
/// field's, `nullable` included.
fn or_null(mut schema: Object) -> Object {
    schema.schema_type = utoipa::openapi::schema::SchemaType::from_iter([Type::String, Type::Null]);
    if let Some(values) = schema.enum_values.as_mut() {
        values.push(serde_json::Value::Null);
    }
    schema
}

/// [`presets`], or null.
fn preset_or_null() -> Object {
    or_null(presets())
}

/// [`language`], or null.
fn language_or_null() -> Object {
    or_null(language())
}

/// What [`language`] allows, as a regular expression both the server's tests and the fuzzer read.
pub const LANGUAGE_PATTERN: &str = r"^[^\s\x00-\x1f\x7f-\x9f]([^\x00-\x1f\x7f-\x9f]{0,38}[^\s\x00-\x1f\x7f-\x9f])?$";

/// A callback URL, as the upload form and `PUT /api/v1/webhook` take it.
pub fn callback_url() -> Object {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .format(Some(SchemaFormat::Custom("uri".into())))
        .pattern(Some(r"^https?://[^/@?#\s]+([/?#]\S*)?$"))
        .max_length(Some(engine::webhooks::target::MAX_URL_LEN))
        .description(Some(
            "Where to POST the job's end (signed). An http(s) URL this server may call: its operator may \
             allow only some hosts, and never private addresses; one it may not call is 422.",
        ))
        .build()
}

/// The body of `POST /api/v1/jobs/{id}/run-again` (all optional): another preset, and a
/// translation's language; left out or null, the earlier job's.
#[derive(ToSchema, serde::Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
pub struct RunAgainBody {
    #[schema(schema_with = preset_or_null)]
    preset: Option<String>,
    #[schema(schema_with = language_or_null)]
    language: Option<String>,
}

/// A done job's result.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct ResultBody {
    id: String,
    /// The provider's answer: `markdown`, and the figures of the run.
    result: serde_json::Map<String, serde_json::Value>,
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Sluice API",
        description = "Upload documents to be processed by AI providers behind a durable queue, and follow each job to its end. \
Authenticate with an API token (`Authorization: Bearer <token>`, made on the account page) or the browser's session. \
Uploads are admitted atomically: 402 when out of credits, 429 when over your limit of documents in progress; \
nothing is stored or charged when an upload is refused.",
    ),
    modifiers(&Security),
    security(("token" = []), ("session" = [])),
    components(schemas(ErrorBody))
)]
pub struct ApiDoc;

/// The two ways to call the API.
struct Security;

impl Modify for Security {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "token",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some("An API token from the account page."))
                    .build(),
            ),
        );
        components
            .add_security_scheme("session", SecurityScheme::ApiKey(ApiKey::Cookie(ApiKeyValue::new("sluice_session"))));
    }
}
