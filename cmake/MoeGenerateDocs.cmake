# Build step (cmake -P): the bash completion and the man page, both from the built binary's own
# command line definition. -DBIN=moe-train -DOUT_DIR=dir -DHELP2MAN=path-or-empty -DINCLUDE=h2m
execute_process(COMMAND "${BIN}" completion bash OUTPUT_FILE "${OUT_DIR}/moe-train.bash"
                RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${BIN} completion bash: exit ${rc}")
endif()
if(HELP2MAN)
  # Debian's help2man: NAME, SYNOPSIS, DESCRIPTION and OPTIONS from --help and --version.
  execute_process(COMMAND "${HELP2MAN}" --no-info --section 1 --include "${INCLUDE}"
                          --name "train Mixture-of-Experts language models from a ds_config.json"
                          --output "${OUT_DIR}/moe-train.1" "${BIN}"
                  RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "help2man ${BIN}: exit ${rc}")
  endif()
  return()
endif()
# Without help2man: the same --help text, preformatted, plus the sections of the include file.
execute_process(COMMAND "${BIN}" --help OUTPUT_VARIABLE help RESULT_VARIABLE rc)
execute_process(COMMAND "${BIN}" --version OUTPUT_VARIABLE version)
string(REGEX MATCH "^moe-train [^ \n]+" version "${version}")
string(REPLACE "\\" "\\e" help "${help}")
string(REGEX REPLACE "(^|\n)([.'])" "\\1\\\\&\\2" help "${help}")
file(READ "${INCLUDE}" extra)
string(REGEX REPLACE "\\[([A-Z ]+)\\]" ".SH \"\\1\"" extra "${extra}")
file(WRITE "${OUT_DIR}/moe-train.1"
     ".TH MOE-TRAIN 1 \"\" \"${version}\" \"User Commands\"\n"
     ".SH NAME\nmoe-train \\- train Mixture-of-Experts language models from a ds_config.json\n"
     ".SH SYNOPSIS\n.B moe-train\n[\\fIOPTIONS\\fR] [\\fISUBCOMMAND\\fR]\n"
     ".SH DESCRIPTION\n.nf\n${help}.fi\n${extra}")
