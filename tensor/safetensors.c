/* safetensors.c — being written */
