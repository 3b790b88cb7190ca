/* scale.c — being written */
