//! What every list endpoint takes in its query string, as RabbitMQ's
//! `rabbit_mgmt_util` reads it: `columns` (dotted for nested fields),
//! `sort` and `sort_reverse`, and pagination (`page`, `page_size`, `name`,
//! `use_regex`), which wraps the list in a page object.

use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::error::ApiError;

/// RabbitMQ's largest page.
const MAX_PAGE_SIZE: usize = 500;
const DEFAULT_PAGE_SIZE: usize = 100;

#[derive(Debug, Default, Deserialize)]
pub struct ListQuery {
    columns: Option<String>,
    sort: Option<String>,
    sort_reverse: Option<String>,
    page: Option<String>,
    page_size: Option<String>,
    name: Option<String>,
    use_regex: Option<String>,
    /// `disable_stats=true`: RabbitMQ leaves out the statistics; here they
    /// cost nothing to keep, so it is accepted and ignored.
    #[allow(dead_code)]
    disable_stats: Option<String>,
}

/// RabbitMQ's default order for most lists (`rabbit_mgmt_util:reply_list/3`,
/// and the queues' and exchanges' `?DEFAULT_SORT`): by vhost, then name.
/// Items without a vhost (vhosts, users, nodes, global parameters) are so
/// sorted by name alone.
pub const SORT_BY_VHOST_AND_NAME: &[&str] = &["vhost", "name"];

/// Bindings (`rabbit_mgmt_wm_bindings`). RabbitMQ's list also names
/// `type`, a field bindings do not have, which so sorts nothing.
pub const SORT_BINDINGS: &[&str] = &[
    "vhost",
    "source",
    "destination",
    "routing_key",
    "properties_key",
];

/// Policies and operator policies sort by priority; RabbitMQ breaks ties
/// by comparing the items themselves, which begin with vhost and name.
pub const SORT_POLICIES: &[&str] = &["priority", "vhost", "name"];

/// Permissions (`rabbit_mgmt_wm_permissions*`).
pub const SORT_PERMISSIONS: &[&str] = &["vhost", "user"];

/// Topic permissions: as permissions, ties broken by the exchange, which
/// is where RabbitMQ's comparison of the whole items lands.
pub const SORT_TOPIC_PERMISSIONS: &[&str] = &["vhost", "user", "exchange"];

impl ListQuery {
    /// Filters, sorts, pages and trims `items` as the query asks; sorted by
    /// vhost and name by default ([`SORT_BY_VHOST_AND_NAME`]).
    pub fn apply(&self, items: Vec<Value>) -> Result<Value, ApiError> {
        self.apply_sorted_by(items, SORT_BY_VHOST_AND_NAME)
    }

    /// As [`Self::apply`], sorted by `default_sort`'s fields by default.
    /// A `sort` field in the query comes first and these break its ties,
    /// as in RabbitMQ (`rabbit_mgmt_util:merge_sorts`).
    pub fn apply_sorted_by(
        &self,
        mut items: Vec<Value>,
        default_sort: &[&str],
    ) -> Result<Value, ApiError> {
        let total_count = items.len();
        let paged = self.page.is_some();
        if paged {
            if let Some(filter) = self.name.as_deref().filter(|name| !name.is_empty()) {
                let use_regex = self.use_regex.as_deref() == Some("true");
                let matcher = if use_regex {
                    Some(regex::Regex::new(filter).map_err(|error| {
                        ApiError::bad_request(format!("invalid regular expression: {error}"))
                    })?)
                } else {
                    None
                };
                let filter_lower = filter.to_lowercase();
                items.retain(|item| {
                    let name = item.get("name").and_then(Value::as_str).unwrap_or("");
                    match &matcher {
                        Some(matcher) => matcher.is_match(name),
                        None => name.to_lowercase().contains(&filter_lower),
                    }
                });
            }
        }
        let asked = self.sort.as_deref().filter(|key| !key.is_empty());
        let sort_keys: Vec<Vec<&str>> = asked
            .into_iter()
            .chain(default_sort.iter().copied())
            .map(|key| key.split('.').collect())
            .collect();
        items.sort_by(|left, right| {
            sort_keys
                .iter()
                .map(|path| compare(lookup(left, path), lookup(right, path)))
                .find(|order| order.is_ne())
                .unwrap_or(std::cmp::Ordering::Equal)
        });
        if self.sort_reverse.as_deref() == Some("true") {
            items.reverse();
        }
        let columns = self.columns.as_deref().map(|columns| {
            columns
                .split(',')
                .filter(|column| !column.is_empty())
                .map(|column| column.split('.').collect::<Vec<_>>())
                .collect::<Vec<_>>()
        });
        let trim = |item: Value| match &columns {
            Some(columns) => keep_columns(&item, columns),
            None => item,
        };
        if !paged {
            return Ok(Value::Array(items.into_iter().map(trim).collect()));
        }
        let page = parse_number(self.page.as_deref(), 1);
        let page_size = parse_number(self.page_size.as_deref(), DEFAULT_PAGE_SIZE);
        let (Some(page), Some(page_size)) = (page, page_size) else {
            return Err(pagination_error(
                self.page.as_deref(),
                self.page_size.as_deref(),
            ));
        };
        if page == 0 || page_size == 0 || page_size > MAX_PAGE_SIZE {
            return Err(ApiError {
                error: "invalid_pagination_parameters",
                ..ApiError::bad_request(format!(
                    "Invalid pagination parameters: page number {page}, page size {page_size}"
                ))
            });
        }
        let filtered_count = items.len();
        let page_count = filtered_count.div_ceil(page_size).max(1);
        if page > page_count {
            return Err(ApiError {
                error: "page_out_of_range",
                ..ApiError::bad_request(format!(
                    "Page out of range, page: {page} page size: {page_size}, len: {filtered_count}"
                ))
            });
        }
        let page_items: Vec<Value> = items
            .into_iter()
            .skip((page - 1) * page_size)
            .take(page_size)
            .map(trim)
            .collect();
        Ok(json!({
            "filtered_count": filtered_count,
            "item_count": page_items.len(),
            "items": page_items,
            "page": page,
            "page_count": page_count,
            "page_size": page_size,
            "total_count": total_count,
        }))
    }
}

fn parse_number(text: Option<&str>, default: usize) -> Option<usize> {
    match text {
        None | Some("") => Some(default),
        Some(text) => text.parse().ok(),
    }
}

fn pagination_error(page: Option<&str>, page_size: Option<&str>) -> ApiError {
    ApiError {
        error: "invalid_pagination_parameters",
        ..ApiError::bad_request(format!(
            "Invalid pagination parameters: page number {}, page size {}",
            page.unwrap_or("1"),
            page_size.unwrap_or("100")
        ))
    }
}

fn lookup<'a>(item: &'a Value, path: &[&str]) -> Option<&'a Value> {
    path.iter().try_fold(item, |value, key| value.get(*key))
}

/// As Erlang orders terms, which RabbitMQ sorts by: numbers, then atoms
/// (booleans, null), then objects, then strings. A missing field counts as
/// 0, as in `rabbit_mgmt_util:get_dotted_value`.
fn compare(left: Option<&Value>, right: Option<&Value>) -> std::cmp::Ordering {
    fn rank(value: &Value) -> u8 {
        match value {
            Value::Number(_) => 0,
            Value::Bool(_) | Value::Null => 1,
            Value::Object(_) => 2,
            Value::Array(_) => 3,
            Value::String(_) => 4,
        }
    }
    let zero = Value::from(0);
    match (left.unwrap_or(&zero), right.unwrap_or(&zero)) {
        (Value::Number(left), Value::Number(right)) => left
            .as_f64()
            .unwrap_or_default()
            .total_cmp(&right.as_f64().unwrap_or_default()),
        (Value::String(left), Value::String(right)) => left.cmp(right),
        (left, right) => rank(left)
            .cmp(&rank(right))
            .then_with(|| left.to_string().cmp(&right.to_string())),
    }
}

/// The item with only `columns`, each a path into nested objects.
fn keep_columns(item: &Value, columns: &[Vec<&str>]) -> Value {
    let mut kept = Map::new();
    for path in columns {
        let Some(value) = lookup(item, path) else {
            continue;
        };
        let mut target = Some(&mut kept);
        for key in &path[..path.len() - 1] {
            // A column both whole and nested (`name,name.x`) keeps the
            // whole value.
            target = target.and_then(|map| {
                map.entry((*key).to_owned())
                    .or_insert_with(|| Value::Object(Map::new()))
                    .as_object_mut()
            });
        }
        if let Some(target) = target {
            target.insert(path[path.len() - 1].to_owned(), value.clone());
        }
    }
    Value::Object(kept)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn items() -> Vec<Value> {
        vec![
            json!({"name": "b", "messages": 5, "message_stats": {"publish": 1}}),
            json!({"name": "a", "messages": 7, "message_stats": {"publish": 3}}),
            json!({"name": "cq", "messages": 1}),
        ]
    }

    fn query(text: &str) -> ListQuery {
        serde_urlencoded_like(text)
    }

    /// Parses `a=1&b=2` the way axum's Query extractor would.
    fn serde_urlencoded_like(text: &str) -> ListQuery {
        let map: std::collections::HashMap<String, String> = text
            .split('&')
            .filter(|pair| !pair.is_empty())
            .map(|pair| {
                let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
                (key.to_owned(), value.to_owned())
            })
            .collect();
        serde_json::from_value(serde_json::to_value(map).unwrap()).unwrap()
    }

    #[test]
    fn lists_sort_by_name_and_keep_nested_columns() {
        let listed = query("columns=name,message_stats.publish")
            .apply(items())
            .unwrap();
        assert_eq!(
            listed,
            json!([
                {"name": "a", "message_stats": {"publish": 3}},
                {"name": "b", "message_stats": {"publish": 1}},
                {"name": "cq"},
            ])
        );
        let by_messages = query("sort=messages&sort_reverse=true&columns=name")
            .apply(items())
            .unwrap();
        assert_eq!(
            by_messages,
            json!([{"name": "a"}, {"name": "b"}, {"name": "cq"}])
        );
    }

    #[test]
    fn lists_sort_by_vhost_then_name_and_break_a_sort_fields_ties_so() {
        let items = || {
            vec![
                json!({"vhost": "b", "name": "aa", "messages": 1}),
                json!({"vhost": "a", "name": "zz", "messages": 1}),
                json!({"vhost": "/", "name": "mm", "messages": 2}),
                json!({"vhost": "a", "name": "bb"}),
            ]
        };
        let names = |listed: Value| -> Vec<String> {
            listed
                .as_array()
                .unwrap()
                .iter()
                .map(|item| {
                    format!(
                        "{}:{}",
                        item["vhost"].as_str().unwrap(),
                        item["name"].as_str().unwrap()
                    )
                })
                .collect()
        };
        assert_eq!(
            names(query("").apply(items()).unwrap()),
            ["/:mm", "a:bb", "a:zz", "b:aa"]
        );
        // A missing field counts as 0, as in RabbitMQ.
        assert_eq!(
            names(query("sort=messages").apply(items()).unwrap()),
            ["a:bb", "a:zz", "b:aa", "/:mm"]
        );
        let policies = vec![
            json!({"vhost": "b", "name": "p", "priority": 0}),
            json!({"vhost": "a", "name": "q", "priority": 1}),
            json!({"vhost": "/", "name": "r", "priority": 0}),
        ];
        assert_eq!(
            names(query("").apply_sorted_by(policies, SORT_POLICIES).unwrap()),
            ["/:r", "b:p", "a:q"]
        );
    }

    #[test]
    fn columns_named_whole_and_nested_keep_the_whole_value() {
        let listed = query("columns=message_stats,message_stats.publish,name.first")
            .apply(items())
            .unwrap();
        assert_eq!(listed[0]["message_stats"], json!({"publish": 3}));
        let other_order = query("columns=name,name.first").apply(items()).unwrap();
        assert_eq!(other_order[0], json!({"name": "a"}));
    }

    #[test]
    fn pages_filter_by_name_and_refuse_what_rabbitmq_refuses() {
        let page = query("page=2&page_size=2&columns=name")
            .apply(items())
            .unwrap();
        assert_eq!(page["items"], json!([{"name": "cq"}]));
        assert_eq!(page["page_count"], 2);
        assert_eq!(page["total_count"], 3);
        let filtered = query("page=1&name=%5Ec&use_regex=true").apply(items());
        // The query string is decoded by the extractor; here it is raw.
        assert!(filtered.is_ok());
        let regex = query("page=1&name=^c&use_regex=true&columns=name")
            .apply(items())
            .unwrap();
        assert_eq!(regex["items"], json!([{"name": "cq"}]));
        assert_eq!(regex["filtered_count"], 1);
        let zero = query("page=0&page_size=2").apply(items()).unwrap_err();
        assert_eq!(zero.error, "invalid_pagination_parameters");
        assert_eq!(
            zero.reason,
            "Invalid pagination parameters: page number 0, page size 2"
        );
        let too_big = query("page=1&page_size=1000").apply(items()).unwrap_err();
        assert_eq!(too_big.status, axum::http::StatusCode::BAD_REQUEST);
        let too_far = query("page=5&page_size=2").apply(items()).unwrap_err();
        assert_eq!(
            too_far.reason,
            "Page out of range, page: 5 page size: 2, len: 3"
        );
    }
}
