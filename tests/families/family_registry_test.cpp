// The test every family passes by being registered (docs/adding-a-family.md): found by both its
// names, and its tiny config.json imported, claimed back by export-hf, written and read again to
// the same sections. tests/hf/*.py hold the weight-level round trips against transformers.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "moe/config/config.h"
#include "moe/families/model_family.h"
#include "moe/hf/hf_config.h"
#include "moe/util/errors.h"

namespace moe::families {
namespace {

using nlohmann::json;

config::Config config_of(const json& sections) {
  json root = sections;
  root["data"] = {{"path", "-"}};
  root["train_micro_batch_size_per_gpu"] = 1;
  config::Config cfg = config::from_json(root, "config.json");
  config::validate(cfg);
  return cfg;
}

TEST(FamilyRegistry, EveryFamilyIsFoundByBothNamesAndNamesAreUnique) {
  ASSERT_GE(all_families().size(), 7u);
  std::set<std::string> names;
  for (const ModelFamily* f : all_families()) {
    EXPECT_EQ(&family_named(f->architecture(), "test"), f);
    EXPECT_EQ(&family_named(f->model_type(), "test"), f);
    EXPECT_TRUE(names.insert(f->architecture()).second) << f->architecture();
    EXPECT_TRUE(names.insert(f->model_type()).second) << f->model_type();
    EXPECT_NE(std::string(f->title()), "");
    EXPECT_NE(std::string(f->releases()), "");
  }
}

TEST(FamilyRegistry, AnUnknownNameListsEveryArchitecture) {
  try {
    family_named("LlamaForCausalLM", "hf: config.json: architectures:");
    FAIL() << "LlamaForCausalLM was accepted";
  } catch (const UserError& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.rfind("hf: config.json: architectures: \"LlamaForCausalLM\" is not supported: "
                         "expected ",
                         0),
              0u)
        << what;
    for (const ModelFamily* f : all_families()) {
      EXPECT_NE(what.find(f->architecture()), std::string::npos) << what;
    }
  }
}

class EachFamily : public ::testing::TestWithParam<const ModelFamily*> {};

TEST_P(EachFamily, TinyConfigImportsExportsAndImportsToTheSameSections) {
  const ModelFamily& family = *GetParam();
  const ModelFamily* read = nullptr;
  std::vector<std::string> warnings;
  const json sections =
      hf::architecture_from_hf(family.tiny_config(), "config.json", &read, &warnings);
  ASSERT_EQ(read, &family);
  const config::Config cfg = config_of(sections);
  // export-hf with no --architecture picks this family back: its claim is the highest. A
  // vision-language release is written back as one from its imported config.json (the base
  // here), never guessed; without that base it is refused in one line.
  const bool vision_language = family.text_config_key() != nullptr;
  // A family that claims nothing (GLM-4.7-Flash: its checkpoints are DeepSeek-V3's too) is
  // written back from the release it was imported from (tests/hf/glm4_moe_lite_test.py).
  if (!vision_language && family.claim(cfg) > 0) {
    EXPECT_EQ(&hf::export_family(cfg, ""), &family);
  }
  EXPECT_EQ(&hf::export_family(cfg, family.model_type()), &family);
  if (vision_language) {
    EXPECT_THROW(hf::hf_config_from(cfg, family, json(), "float32"), UserError);
  }
  const json written =
      hf::hf_config_from(cfg, family, vision_language ? family.tiny_config() : json(), "float32");
  EXPECT_EQ(written["architectures"][0], family.architecture());
  EXPECT_EQ(written["model_type"], family.model_type());
  const ModelFamily* reread = nullptr;
  const json again = hf::architecture_from_hf(written, "exported/config.json", &reread, nullptr);
  EXPECT_EQ(reread, &family);
  EXPECT_EQ(again, sections) << "first import:\n"
                             << sections.dump(1) << "\nafter export:\n"
                             << again.dump(1);
}

// Another family's checkpoint exported as this one: either it fits, or one line "KEY: why".
TEST_P(EachFamily, OtherFamiliesExportAsThisOneOrNameTheKey) {
  const ModelFamily& family = *GetParam();
  for (const ModelFamily* other : all_families()) {
    const config::Config cfg =
        config_of(hf::architecture_from_hf(other->tiny_config(), "config.json", nullptr, nullptr));
    try {
      EXPECT_EQ(&hf::export_family(cfg, family.architecture()), &family);
    } catch (const UserError& e) {
      const std::string what = e.what();
      EXPECT_EQ(what.find('\n'), std::string::npos) << what;
      EXPECT_TRUE(what.rfind("model.", 0) == 0 || what.rfind("moe.", 0) == 0)
          << other->model_type() << " as " << family.model_type() << ": " << what;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Registry, EachFamily, ::testing::ValuesIn(all_families()),
                         [](const auto& info) { return std::string(info.param->model_type()); });

}  // namespace
}  // namespace moe::families
