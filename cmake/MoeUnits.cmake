# Writes the systemd units from scripts/*.service.in with the paths of an install prefix.
# Included at configure time (build/systemd/, for the prefix configured) and by `cmake --install`
# (for the prefix actually installed to, so `--prefix` and CPack's /usr staging are honoured).
# In: MOE_UNIT_PREFIX, MOE_UNIT_OUT (directory), MOE_UNIT_SRC (scripts/), MOE_UNIT_BINDIR,
#     MOE_UNIT_LIBEXECDIR, MOE_UNIT_DATAROOTDIR (relative to the prefix), MOE_UNIT_TORCHRUN.
foreach(_d BINDIR LIBEXECDIR DATAROOTDIR)
  if(IS_ABSOLUTE "${MOE_UNIT_${_d}}")
    set(_${_d} "${MOE_UNIT_${_d}}")
  else()
    set(_${_d} "${MOE_UNIT_PREFIX}/${MOE_UNIT_${_d}}")
  endif()
endforeach()
set(MOE_UNIT_BIN "${_BINDIR}/moe-train")
set(MOE_UNIT_LAUNCH "${_LIBEXECDIR}/moe-train/moe-train-launch")
set(MOE_UNIT_DATADIR "${_DATAROOTDIR}/moe-train")
foreach(_unit moe-train.service moe-train-multigpu.service)
  configure_file("${MOE_UNIT_SRC}/${_unit}.in" "${MOE_UNIT_OUT}/${_unit}" @ONLY)
endforeach()
