# `cmake --install` and `cpack -G DEB` (docs/build.md, "Installing"):
#   bin/moe-train                         finds LibTorch at start, then runs libexec's binary
#   bin/moe-train-setup-runtime           installs LibTorch (torch wheel + CUDA wheels) in a venv
#   libexec/moe-train/moe-train           the binary (no RPATH: the runtime is found at start)
#   libexec/moe-train/runtime.sh          the lookup both of the above and the wrapper share
#   libexec/moe-train/moe-train-launch    the multi-GPU unit's wrapper of torchrun
#   share/moe-train/{configs,docs}        configs (with the Grafana dashboard, prometheus.yml), docs
#   lib/systemd/system/*.service          units with this prefix's paths
#   share/bash-completion/completions/moe-train, share/man/man1/moe-train.1
include(GNUInstallDirs)
set(MOE_SYSTEMD_UNITDIR "lib/systemd/system" CACHE STRING
    "Where the systemd units go, relative to the install prefix")

# LibTorch is not packaged (docs/build.md, "The runtime": gigabytes of CUDA wheels, usable only in
# the wheel layout). The installed entry points look for it at start (scripts/runtime/): in
# MOE_LIBTORCH_DIR, the venv moe-train-setup-runtime recorded, or this build's venv, and refuse
# a torch other than the one built against, naming both.
set(MOE_TORCH_FULL_VERSION "${Torch_VERSION}")
foreach(_version_file "${MOE_TORCH_LIB_DIR}/../version.py" "${MOE_TORCH_LIB_DIR}/../build-version")
  if(EXISTS "${_version_file}")
    file(STRINGS "${_version_file}" _line REGEX "^(__version__ = '.*'|[0-9]+[.].*)$" LIMIT_COUNT 1)
    string(REGEX REPLACE "^__version__ = '(.*)'$" "\\1" MOE_TORCH_FULL_VERSION "${_line}")
    break()
  endif()
endforeach()
string(REGEX REPLACE "[+].*$" "" MOE_TORCH_PIP_VERSION "${MOE_TORCH_FULL_VERSION}")
get_filename_component(MOE_RUNTIME_DEFAULT "${MOE_TORCH_LIB_DIR}/../../../../.." ABSOLUTE)
if(NOT EXISTS "${MOE_TORCH_LIB_DIR}/../version.py")
  get_filename_component(MOE_RUNTIME_DEFAULT "${MOE_TORCH_LIB_DIR}/.." ABSOLUTE)  # an archive
endif()
file(RELATIVE_PATH MOE_BIN_TO_LIBEXEC "/p/${CMAKE_INSTALL_BINDIR}" "/p/${CMAKE_INSTALL_LIBEXECDIR}")
file(RELATIVE_PATH MOE_LIBEXEC_TO_PREFIX "/p/${CMAKE_INSTALL_LIBEXECDIR}/moe-train" "/p")
set(MOE_RUNTIME_OUT "${PROJECT_BINARY_DIR}/runtime")
foreach(_script runtime.sh moe-train moe-train-setup-runtime)
  configure_file("${PROJECT_SOURCE_DIR}/scripts/runtime/${_script}.in" "${MOE_RUNTIME_OUT}/${_script}" @ONLY)
endforeach()
install(PROGRAMS ${MOE_RUNTIME_OUT}/moe-train ${MOE_RUNTIME_OUT}/moe-train-setup-runtime
        DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime)
install(FILES ${MOE_RUNTIME_OUT}/runtime.sh DESTINATION ${CMAKE_INSTALL_LIBEXECDIR}/moe-train
        COMPONENT runtime)
set_target_properties(moe-train PROPERTIES INSTALL_RPATH "")
install(TARGETS moe-train RUNTIME DESTINATION ${CMAKE_INSTALL_LIBEXECDIR}/moe-train COMPONENT runtime)
install(PROGRAMS ${PROJECT_SOURCE_DIR}/scripts/moe-train-launch
        DESTINATION ${CMAKE_INSTALL_LIBEXECDIR}/moe-train COMPONENT launcher)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/configs/ DESTINATION ${CMAKE_INSTALL_DATADIR}/moe-train/configs
        COMPONENT data)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/docs/ DESTINATION ${CMAKE_INSTALL_DATADIR}/moe-train/docs
        COMPONENT data)
install(FILES ${PROJECT_SOURCE_DIR}/README.md ${PROJECT_SOURCE_DIR}/LICENSE
        DESTINATION ${CMAKE_INSTALL_DATADIR}/moe-train COMPONENT data)

# The units: a bare torchrun, which moe-train-launch takes from the runtime (as moe-train does).
set(MOE_UNIT_TORCHRUN torchrun)
set(_unit_vars
    "set(MOE_UNIT_SRC \"${PROJECT_SOURCE_DIR}/scripts\")
     set(MOE_UNIT_BINDIR \"${CMAKE_INSTALL_BINDIR}\")
     set(MOE_UNIT_LIBEXECDIR \"${CMAKE_INSTALL_LIBEXECDIR}\")
     set(MOE_UNIT_DATAROOTDIR \"${CMAKE_INSTALL_DATAROOTDIR}\")
     set(MOE_UNIT_TORCHRUN \"${MOE_UNIT_TORCHRUN}\")")
# At configure time, for the configured prefix (build/systemd/: what the tests run) ...
cmake_language(EVAL CODE "${_unit_vars}")
set(MOE_UNIT_PREFIX "${CMAKE_INSTALL_PREFIX}")
set(MOE_UNIT_OUT "${PROJECT_BINARY_DIR}/systemd")
include(MoeUnits)
# ... and again at install time, for the prefix installed to (--prefix, CPack's staging).
# One scratch directory per destination: installs to two prefixes may run side by side (tests).
install(CODE "${_unit_vars}
  set(MOE_UNIT_PREFIX \"\${CMAKE_INSTALL_PREFIX}\")
  string(MD5 _dest \"\$ENV{DESTDIR}\${CMAKE_INSTALL_PREFIX}\")
  set(MOE_UNIT_OUT \"${PROJECT_BINARY_DIR}/systemd/install-\${_dest}\")
  include(\"${PROJECT_SOURCE_DIR}/cmake/MoeUnits.cmake\")
  file(INSTALL \"\${MOE_UNIT_OUT}/moe-train.service\" \"\${MOE_UNIT_OUT}/moe-train-multigpu.service\"
       DESTINATION \"\${CMAKE_INSTALL_PREFIX}/${MOE_SYSTEMD_UNITDIR}\"
       FILE_PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ)"
  COMPONENT systemd)

# Bash completion and man page, generated from the built binary (help2man when installed).
find_program(MOE_HELP2MAN help2man)
set(MOE_GEN_DIR ${PROJECT_BINARY_DIR}/share)
file(MAKE_DIRECTORY ${MOE_GEN_DIR})
add_custom_command(
  OUTPUT ${MOE_GEN_DIR}/moe-train.bash ${MOE_GEN_DIR}/moe-train.1
  COMMAND ${CMAKE_COMMAND} -DBIN=$<TARGET_FILE:moe-train> -DOUT_DIR=${MOE_GEN_DIR}
          -DHELP2MAN=${MOE_HELP2MAN} -DINCLUDE=${PROJECT_SOURCE_DIR}/cmake/moe-train.h2m
          -P ${PROJECT_SOURCE_DIR}/cmake/MoeGenerateDocs.cmake
  DEPENDS moe-train ${PROJECT_SOURCE_DIR}/cmake/MoeGenerateDocs.cmake
          ${PROJECT_SOURCE_DIR}/cmake/moe-train.h2m
  COMMENT "Generating the bash completion and the man page of moe-train"
  VERBATIM)
add_custom_target(moe-train-docs ALL DEPENDS ${MOE_GEN_DIR}/moe-train.bash ${MOE_GEN_DIR}/moe-train.1)
install(FILES ${MOE_GEN_DIR}/moe-train.bash DESTINATION ${CMAKE_INSTALL_DATADIR}/bash-completion/completions
        RENAME moe-train COMPONENT runtime)
install(FILES ${MOE_GEN_DIR}/moe-train.1 DESTINATION ${CMAKE_INSTALL_MANDIR}/man1 COMPONENT runtime)

# cpack -G DEB: moe-train_<version>_amd64.deb, installing under /usr as Debian packages do (the
# units are written at install time, so they name /usr/bin/moe-train whatever this build's
# prefix). Depends: the Debian packages of the libraries the binary links (ldd + dpkg -S on
# Debian 12) and python3-venv for moe-train-setup-runtime; LibTorch comes from the runtime venv.
set(CPACK_PACKAGE_NAME moe-train)
set(CPACK_PACKAGE_VENDOR moe-train)
set(CPACK_PACKAGE_CONTACT "moe-train maintainers <moe-train@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "Train Mixture-of-Experts language models from a ds_config.json")
set(CPACK_PACKAGE_DESCRIPTION
    "One C++20 binary (LibTorch) that trains MoE transformer language models on a GPU or the CPU,
with systemd units. LibTorch is not included: after installing, run
 moe-train-setup-runtime
once (as root): it installs torch==${MOE_TORCH_PIP_VERSION} and its CUDA wheels from PyPI (or
--wheels DIR) into ${MOE_RUNTIME_DEFAULT} (or --venv DIR, recorded in
/etc/moe-train/runtime.conf). Until then moe-train and its units exit 2 saying so.")
set(CPACK_RESOURCE_FILE_LICENSE ${PROJECT_SOURCE_DIR}/LICENSE)
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_STRIP_FILES ON)  # RelWithDebInfo: 255 MB of debug info stays out of the package
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_ARCHITECTURE amd64)
set(CPACK_DEBIAN_PACKAGE_SECTION science)
set(CPACK_DEBIAN_PACKAGE_DEPENDS
    "libc6, libstdc++6, libgcc-s1, libhdf5-103-1, libspdlog1.10, libfmt9, libssl3, libxxhash0, \
libsentencepiece0, libzstd1, zlib1g, libpcre2-8-0, libicu72, libcurl4, libsystemd0, python3-venv")
# postinst / postrm: systemctl daemon-reload after the units arrive or go (not under dpkg --root).
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA "${PROJECT_SOURCE_DIR}/cmake/deb/postinst;${PROJECT_SOURCE_DIR}/cmake/deb/postrm")
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION TRUE)
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "systemd, bash-completion")
include(CPack)
