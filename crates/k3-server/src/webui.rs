//! The chat page at `/` (docs/SERVER.md "Chat page"): HTML, CSS, JavaScript, the vendored
//! Markdown renderer and the favicon, all embedded in the binary so the page works with no
//! network. The page and its assets need no API key (the API calls it makes do); every
//! response carries a strict Content-Security-Policy: scripts and styles only from this
//! origin, no inline script, no frames, no plugins. `--no-webui` leaves these routes out.

use super::Shared;
use axum::extract::State;
use axum::http::{header, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use std::sync::Arc;

/// Everything from this origin and nothing inline: no inline script or style, no other
/// origin for scripts, styles, images, fonts or fetches, no plugins, no frames, no form
/// posts. Model output is rendered with raw HTML escaped and images shown as text, so a reply
/// cannot make the browser load anything either way.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; \
     style-src 'self'; img-src 'self'; font-src 'self'; connect-src 'self'; \
     object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// One embedded file: its path under `/`, content type and bytes.
struct Asset {
    path: &'static str,
    content_type: &'static str,
    body: &'static [u8],
}

/// The page's files. markdown-it is vendored at a pinned version (webui/vendor/README.md).
static ASSETS: [Asset; 7] = [
    Asset {
        path: "/",
        content_type: "text/html; charset=utf-8",
        body: include_bytes!("webui/index.html"),
    },
    Asset {
        path: "/webui/render.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("webui/render.js"),
    },
    Asset {
        path: "/webui/status.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("webui/status.js"),
    },
    Asset {
        path: "/webui/app.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("webui/app.js"),
    },
    Asset {
        path: "/webui/app.css",
        content_type: "text/css; charset=utf-8",
        body: include_bytes!("webui/app.css"),
    },
    Asset {
        path: "/webui/markdown-it.min.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("webui/vendor/markdown-it.umd.min.js"),
    },
    Asset {
        path: "/favicon.svg",
        content_type: "image/svg+xml",
        body: include_bytes!("webui/favicon.svg"),
    },
];

/// The favicon's index in [`ASSETS`] (also served as `/favicon.ico`).
const FAVICON: usize = 6;

/// An asset with its type and the security headers.
fn respond(asset: &'static Asset) -> Response {
    let mut response = (StatusCode::OK, asset.body).into_response();
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(asset.content_type),
    );
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(
        HeaderName::from_static("cross-origin-opener-policy"),
        HeaderValue::from_static("same-origin"),
    );
    // A new binary may bring new assets: the browser revalidates rather than guessing.
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

/// `GET /webui/config.json`: what the page must know before its first API call — whether
/// it needs a key (so it asks for one instead of drawing a 401). Open, like the page.
async fn config(State(shared): State<Arc<Shared>>) -> Response {
    let body = serde_json::json!({
        "api_key_required": shared.api_key_digest.is_some(),
        "model": shared.model_id,
    });
    let mut response = super::routes::json_response(body);
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// The page's routes, merged into the server's router (the favicon also as `/favicon.ico`,
/// which browsers ask for by themselves).
pub fn router() -> Router<Arc<Shared>> {
    let mut router = Router::new();
    for asset in &ASSETS {
        router = router.route(asset.path, get(move || async move { respond(asset) }));
    }
    router
        .route("/favicon.ico", get(|| async { respond(&ASSETS[FAVICON]) }))
        .route("/webui/config.json", get(config))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Total bytes the page adds to the binary.
    fn assets_bytes() -> usize {
        ASSETS.iter().map(|a| a.body.len()).sum()
    }

    #[test]
    fn the_assets_stay_small_and_the_page_loads_no_inline_script() {
        // docs/SERVER.md "Chat page": the page adds at most 500 KB to the binary.
        assert!(assets_bytes() <= 500_000, "{} bytes", assets_bytes());
        let html = std::str::from_utf8(ASSETS[0].body).unwrap();
        // every <script> names a file of this origin: the CSP allows nothing inline
        for tag in html.split("<script").skip(1) {
            let open = &tag[..tag.find('>').unwrap()];
            assert!(
                open.contains("src=\"/webui/"),
                "inline or foreign script: {open}"
            );
            assert!(tag[open.len() + 1..].starts_with("</script>"), "{tag}");
        }
        assert!(!html.contains("style=\""), "inline style attribute");
        assert!(!html.contains("http://") && !html.contains("https://"));
        assert_eq!(ASSETS[FAVICON].path, "/favicon.svg");
    }

    #[test]
    fn every_asset_carries_the_policy_and_its_type() {
        for asset in &ASSETS {
            let r = respond(asset);
            assert_eq!(r.status(), StatusCode::OK);
            let h = r.headers();
            assert_eq!(h[header::CONTENT_SECURITY_POLICY], CONTENT_SECURITY_POLICY);
            assert_eq!(h[header::CONTENT_TYPE], asset.content_type);
            assert_eq!(h[header::X_CONTENT_TYPE_OPTIONS], "nosniff");
        }
        assert!(!CONTENT_SECURITY_POLICY.contains("unsafe"));
    }
}
