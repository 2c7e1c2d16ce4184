//! The web console: static assets compiled into the binary and served at
//! `/ui/` on the gRPC/HTTP port (`/` and `/ui` redirect there).
//!
//! The console is plain HTML, CSS and JavaScript modules under
//! `gateway/console/`, with no build step: the files are `include_str!`ed
//! here, so `pelotond` serves them with nothing installed beside it and
//! never fetches anything from outside. In the browser the console talks
//! only to the JSON/HTTP mirror (`/v1/...`, see `http.rs`) and follows
//! `/v1/watch` as server-sent events; this module knows nothing of the API.

use axum::body::Body;
use axum::http::{Response, StatusCode, header};

/// One asset: its name under `/ui/`, its content type and its bytes.
struct Asset {
    name: &'static str,
    content_type: &'static str,
    body: &'static str,
}

/// Every file of the console. `index.html` is also served at `/ui/`.
const ASSETS: &[Asset] = &[
    Asset {
        name: "index.html",
        content_type: "text/html; charset=utf-8",
        body: include_str!("../console/index.html"),
    },
    Asset {
        name: "console.css",
        content_type: "text/css; charset=utf-8",
        body: include_str!("../console/console.css"),
    },
    Asset {
        name: "app.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_str!("../console/app.js"),
    },
    Asset {
        name: "api.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_str!("../console/api.js"),
    },
    Asset {
        name: "views.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_str!("../console/views.js"),
    },
];

/// Adds the console's routes (`/`, `/ui`, `/ui/`, `/ui/{file}`) to a router.
/// None of them overlaps the mirror's `/v1/...` or gRPC's `/package.Service/Method`.
pub fn mount(router: axum::Router) -> axum::Router {
    router
        .route("/", axum::routing::get(|| async { redirect_to_console() }))
        .route(
            "/ui",
            axum::routing::get(|| async { redirect_to_console() }),
        )
        .route("/ui/", axum::routing::get(|| async { asset("index.html") }))
        .route(
            "/ui/{file}",
            axum::routing::get(|path: axum::extract::Path<String>| async move { asset(&path) }),
        )
}

fn redirect_to_console() -> Response<Body> {
    Response::builder()
        .status(StatusCode::FOUND)
        .header(header::LOCATION, "/ui/")
        .body(Body::empty())
        .expect("a valid response")
}

fn asset(name: &str) -> Response<Body> {
    match ASSETS.iter().find(|a| a.name == name) {
        Some(a) => Response::builder()
            .status(StatusCode::OK)
            .header(header::CONTENT_TYPE, a.content_type)
            // The assets change with the binary: a browser asks again
            // (cheap: a few small files) rather than keep an old console.
            .header(header::CACHE_CONTROL, "no-cache")
            .body(Body::from(a.body))
            .expect("a valid response"),
        None => Response::builder()
            .status(StatusCode::NOT_FOUND)
            .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
            .body(Body::from(format!(
                "no such console file: {}\n",
                crate::convert::shown(name)
            )))
            .expect("a valid response"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_module_imported_by_the_console_is_served() {
        for a in ASSETS {
            for line in a.body.lines() {
                let Some(rest) = line.trim().strip_prefix("import ") else {
                    continue;
                };
                let Some(from) = rest.split("from").nth(1) else {
                    continue;
                };
                let file = from
                    .trim()
                    .trim_end_matches(';')
                    .trim_matches(|c| c == '"' || c == '\'')
                    .trim_start_matches("./");
                assert!(
                    ASSETS.iter().any(|x| x.name == file),
                    "{} imports {file}, which is not served",
                    a.name
                );
            }
        }
    }
}
