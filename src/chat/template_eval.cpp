#include "template_eval.h"

#include <algorithm>
#include <iterator>

#include "moe/util/errors.h"
#include "template_values.h"

namespace moe::chat {

Renderer::Renderer(const std::string& origin, const Json& context,
                   std::vector<std::pair<size_t, size_t>>* generation)
    : origin_(origin), generation_(generation) {
  scopes_.emplace_back();
  for (const auto& [k, v] : context.items()) scopes_.back()[k] = v;
}

void Renderer::run(const Body& body) {
  if (exec(body) != Flow::kNormal) fail(0, "break or continue outside a loop");
}

void Renderer::fail(int line, const std::string& what) const {
  throw UserError("chat template: " + origin_ + (line > 0 ? ":" + std::to_string(line) : "") +
                  ": " + what);
}

// The sandbox's size budget for the output and for every string value built.
void Renderer::check_size(size_t bytes, int line) const {
  if (std::optional<std::string> over = RenderBudget::text(bytes)) fail(line, *over);
}

void Renderer::charge_built(const Json& v, int line) {
  if (std::optional<std::string> over = budget_.built(v)) fail(line, *over);
}

// The output budget counts the text of the callers of the macros (and set blocks) rendering
// now, held while they render.
void Renderer::emit(const std::string& text, int line) {
  check_size(suspended_bytes_ + out_.size() + text.size(), line);
  out_ += text;
}

Value Renderer::lookup(const std::string& name) const {
  for (auto s = scopes_.rbegin(); s != scopes_.rend(); ++s) {
    auto hit = s->find(name);
    if (hit != s->end())
      return is_unbound(hit->second) ? Value::undef() : Value{hit->second, false};
  }
  return Value::undef();
}

Json* Renderer::find_variable(const std::string& name) {
  for (auto s = scopes_.rbegin(); s != scopes_.rend(); ++s) {
    auto hit = s->find(name);
    if (hit != s->end()) return &hit->second;
  }
  return nullptr;
}

// What `body()` writes, instead of writing it to the output.
template <typename Fn>
std::string Renderer::capture(Fn&& body) {
  std::string saved = std::move(out_);
  out_.clear();
  suspended_bytes_ += saved.size();
  body();
  suspended_bytes_ -= saved.size();
  std::string captured = std::move(out_);
  out_ = std::move(saved);
  return captured;
}

Renderer::Flow Renderer::exec(const Body& body) {
  for (const auto& n : body) {
    const Flow f = exec(*n);
    if (f != Flow::kNormal) return f;
  }
  return Flow::kNormal;
}

// The sandbox's limit on the renderer's recursion (max_render_depth()).
void Renderer::too_deep(int line) const {
  fail(line, too_deep_message("rendering", max_render_depth(), "template.render_depth"));
}

Renderer::Flow Renderer::exec(const Node& n) {
  NestingGuard guard(
      render_depth_, [&] { too_deep(n.line); }, max_render_depth());
  return exec_node(n);
}

Renderer::Flow Renderer::exec_node(const Node& n) {
  switch (n.kind) {
    case Node::kText:
      emit(n.text, n.line);
      return Flow::kNormal;
    case Node::kOutput:
      emit(to_text(eval(*n.expr, n.line)), n.line);
      return Flow::kNormal;
    case Node::kIf:
      for (const auto& [cond, body] : n.branches) {
        if (truthy(eval(*cond, n.line))) return exec(body);
      }
      return exec(n.else_body);
    case Node::kFor:
      return exec_for(n);
    case Node::kSet: {
      Value v = eval(*n.expr, n.line);
      assign(n, std::move(v.v));
      return Flow::kNormal;
    }
    case Node::kSetBlock: {
      Flow f = Flow::kNormal;
      std::string captured = capture([&] { f = exec(n.body); });
      assign(n, Json(std::move(captured)));
      return f;
    }
    case Node::kMacro:
      define_macro(n);
      return Flow::kNormal;
    case Node::kGeneration: {
      const size_t begin = out_.size();
      const Flow f = exec(n.body);
      if (generation_ != nullptr) generation_->emplace_back(begin, out_.size());
      return f;
    }
    case Node::kBreak:
      return Flow::kBreak;
    case Node::kContinue:
      return Flow::kContinue;
  }
  return Flow::kNormal;
}

// {% macro %}: binds its name, here, to the macro and the scopes it sees (those open here).
void Renderer::define_macro(const Node& n) {
  const Macro m{&n, scopes_.size()};
  size_t i = 0;
  while (i < macros_.size() && (macros_[i].node != m.node || macros_[i].depth != m.depth)) ++i;
  if (i == macros_.size()) macros_.push_back(m);
  scopes_.back()[n.text] = Json::binary(std::vector<uint8_t>(n.text.begin(), n.text.end()), i);
}

// A call of a macro: the arguments bound to its parameters (positional ones, then keywords,
// then the defaults, evaluated in order in the macro's scope; a parameter without any is
// undefined), its body rendered seeing the variables of its definition's scopes (not the
// caller's locals; sets stay local, namespaces are shared), and the text it wrote returned.
Value Renderer::call_macro(const Json& callee, std::vector<Value> a, const Expr& e, int line) {
  const Macro m = macros_.at(static_cast<size_t>(callee.get_binary().subtype()));
  const Node& def = *m.node;
  std::vector<std::optional<Value>> bound(def.targets.size());
  if (a.size() > bound.size()) {
    fail(line, "macro '" + def.text + "' takes not more than " + std::to_string(bound.size()) +
                   " argument(s)");
  }
  for (size_t i = 0; i < a.size(); ++i) bound[i] = std::move(a[i]);
  for (const auto& [k, x] : e.kwargs) {
    const auto at = std::find(def.targets.begin(), def.targets.end(), k);
    const auto i = static_cast<size_t>(at - def.targets.begin());
    if (at == def.targets.end() || bound[i]) {
      fail(line, "macro '" + def.text + "' takes no keyword argument '" + k + "'");
    }
    bound[i] = eval(*x, line);
  }
  if (std::optional<std::string> over = budget_.macro_call()) fail(line, *over);
  if (++macro_depth_ > max_nesting()) {
    fail(line, too_deep_message("macro calls", max_nesting(), "template.nesting"));
  }
  // The caller's scopes above the definition's are hidden while the macro renders.
  const size_t keep = std::min(m.depth, scopes_.size());
  std::vector<std::map<std::string, Json>> hidden(
      std::make_move_iterator(scopes_.begin() + static_cast<std::ptrdiff_t>(keep)),
      std::make_move_iterator(scopes_.end()));
  scopes_.resize(keep);
  scopes_.emplace_back();
  for (size_t i = 0; i < bound.size(); ++i) {
    if (!bound[i] && def.defaults[i]) bound[i] = eval(*def.defaults[i], def.line);
    const bool unbound = !bound[i] || bound[i]->undefined;
    scopes_.back()[def.targets[i]] =
        unbound ? Json::binary(std::vector<uint8_t>()) : std::move(bound[i]->v);
  }
  Flow f = Flow::kNormal;
  std::string text = capture([&] { f = exec(def.body); });
  if (f != Flow::kNormal) fail(def.line, "break or continue outside a loop");
  scopes_.resize(keep);
  for (auto& s : hidden) scopes_.push_back(std::move(s));
  --macro_depth_;
  return {Json(std::move(text)), false};
}

void Renderer::assign(const Node& n, Json v) {
  if (n.attribute.empty()) {
    scopes_.back()[n.text] = std::move(v);
    return;
  }
  Json* ns = find_variable(n.text);
  if (ns == nullptr || !ns->is_object()) fail(n.line, n.text + " is not a namespace");
  (*ns)[n.attribute] = std::move(v);
}

Renderer::Flow Renderer::exec_for(const Node& n) {
  Value seq = eval(*n.expr, n.line);
  std::vector<Json> items;
  if (seq.v.is_array()) {
    items.assign(seq.v.begin(), seq.v.end());
  } else if (seq.v.is_object()) {
    for (const auto& [k, v] : seq.v.items()) items.emplace_back(k);
  } else if (seq.v.is_string()) {
    for (uint32_t c : code_points(seq.v.get<std::string>()))
      items.emplace_back(from_code_points({c}));
  } else if (!seq.undefined && !seq.v.is_null()) {
    fail(n.line, "a for loop over something that is not a list, mapping or string");
  }
  if (n.loop_filter) {  // "for x in xs if cond": the loop sees only the kept items
    std::vector<Json> kept;
    for (Json& item : items) {
      scopes_.emplace_back();
      bind(n, item);
      if (truthy(eval(*n.loop_filter, n.line))) kept.push_back(std::move(item));
      scopes_.pop_back();
    }
    items = std::move(kept);
  }
  if (items.empty()) return exec(n.else_body);
  const auto len = static_cast<int64_t>(items.size());
  for (int64_t i = 0; i < len; ++i) {
    if (std::optional<std::string> over = budget_.loop_iteration()) fail(n.line, *over);
    scopes_.emplace_back();
    bind(n, items[static_cast<size_t>(i)]);
    Json loop = Json::object();
    loop["index"] = i + 1;
    loop["index0"] = i;
    loop["revindex"] = len - i;
    loop["revindex0"] = len - i - 1;
    loop["first"] = i == 0;
    loop["last"] = i == len - 1;
    loop["length"] = len;
    if (i > 0) loop["previtem"] = items[static_cast<size_t>(i - 1)];
    if (i + 1 < len) loop["nextitem"] = items[static_cast<size_t>(i + 1)];
    scopes_.back()["loop"] = std::move(loop);
    const Flow f = exec(n.body);
    scopes_.pop_back();
    if (f == Flow::kBreak) break;
  }
  return Flow::kNormal;
}

void Renderer::bind(const Node& n, const Json& item) {
  if (n.targets.size() == 1) {
    scopes_.back()[n.targets[0]] = item;
    return;
  }
  if (!item.is_array() || item.size() != n.targets.size()) {
    fail(n.line, "cannot unpack a loop item into " + std::to_string(n.targets.size()) + " names");
  }
  for (size_t k = 0; k < n.targets.size(); ++k) scopes_.back()[n.targets[k]] = item[k];
}

}  // namespace moe::chat
